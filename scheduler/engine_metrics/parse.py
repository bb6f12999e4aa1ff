"""Prometheus text -> `Metrics`, cheaply: it runs about 20 times a second per pod.

Only the lines of the wanted families are looked at: each family is found with `str.find` on
"\\n<name>" (C speed, no split of the page), and label sets are parsed only where a spec needs them
(a label selector, the LoRA and cache-info gauges). The rest of the page, histograms included, is
never tokenised.

Semantics follow GIE's core-metrics-extractor: among several samples of a metric the one with the
newest timestamp wins (the first one when there are none); for `vllm:lora_requests_info` the one with
the largest value wins (its value is the time it was written). What GIE reports as an error is an
error or a warning here, never an exception:

* a required metric (queue, running, KV usage) that is missing or has an unparsable value is an
  error: `ParseResult.ok` is False and the scrape counts as failed;
* an optional one (LoRA, cache info, block size and count) that is missing or bad is a warning:
  those fields keep the `previous` values, as GIE keeps the endpoint's last metrics.

Unlike Prometheus' own parser, a syntax error in a family we do not read is ignored."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from scheduler.engine_metrics.spec import (
    LORA_MAX_LABEL,
    LORA_RUNNING_LABEL,
    LORA_WAITING_LABEL,
    EngineSpec,
    MetricSpec,
)
from scheduler.types import Metrics

# The part of a sample line after the metric name: optional {labels}, the value, an optional timestamp.
_QUOTED = r'"[^"\\]*(?:\\.[^"\\]*)*"'
# Unrolled loops ("normal* (special normal*)*"), so a line without its closing brace fails in linear time.
_REST_RE = re.compile(
    r'(?:\{([^"}]*(?:' + _QUOTED + r'[^"}]*)*)\})?[ \t]+(\S+)(?:[ \t]+(-?\d+))?[ \t\r]*$'
)
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE_RE = re.compile(r'\\[\\"n]')


@dataclass(slots=True)
class Sample:
    labels: dict[str, str] | None  # None when the labels were not asked for
    value: float
    timestamp_ms: int | None


@dataclass(slots=True)
class ParseResult:
    """The metrics read from one page. `errors` make the scrape a failure; `warnings` do not."""

    metrics: Metrics
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def error(self) -> str | None:
        return "; ".join(self.errors) if self.errors else None


class _Bad(ValueError):
    pass


class _Missing(_Bad):
    pass


def family_lines(text: str, name: str) -> list[str]:
    """The rest (after the name) of every sample line of metric `name`, in page order."""
    out: list[str] = []
    n = len(name)
    if text.startswith(name) and text[n : n + 1] in ("{", " ", "\t"):
        end = text.find("\n")
        out.append(text[n:] if end == -1 else text[n:end])
    needle = "\n" + name
    n += 1
    i = text.find(needle)
    while i != -1:
        j = i + n
        c = text[j : j + 1]
        if c == "{" or c == " " or c == "\t":
            end = text.find("\n", j)
            if end == -1:
                end = len(text)
            out.append(text[j:end])
            i = text.find(needle, end)
        else:
            i = text.find(needle, j)
    return out


def parse_labels(body: str) -> dict[str, str]:
    """`name="value",...` -> dict. Lenient: a pair that is not `name="value"` is skipped (the
    caller then misses the label it wanted and says so)."""
    labels: dict[str, str] = {}
    for key, value in _LABEL_RE.findall(body):
        if "\\" in value:
            value = _ESCAPE_RE.sub(lambda e: _ESCAPES[e.group(0)], value)
        labels[key] = value
    return labels


def parse_value(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise _Bad(f"unparsable value {text!r}") from None


def samples(text: str, name: str, with_labels: bool) -> list[Sample]:
    """Every sample of `name`; raises _Bad on a malformed line of that family."""
    out = []
    for rest in family_lines(text, name):
        m = _REST_RE.match(rest)
        if m is None:
            shown = rest.rstrip()
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise _Bad(f"malformed sample line {name}{shown!r}")
        body, value, ts = m.groups()
        labels = (parse_labels(body) if body else {}) if with_labels else None
        out.append(Sample(labels, parse_value(value), int(ts) if ts is not None else None))
    return out


def _matches(sample: Sample, spec: MetricSpec) -> bool:
    labels = sample.labels or {}
    return all(labels.get(k) == v for k, v in spec.labels)


def latest(text: str, spec: MetricSpec, need_labels: bool = False) -> Sample:
    """GIE's getLatestMetric: the matching sample with the newest timestamp (first one on ties)."""
    found = samples(text, spec.name, need_labels or bool(spec.labels))
    if not found:
        raise _Missing(f"metric family {spec.name!r} not found")
    best: Sample | None = None
    best_ts = -1
    for s in found:
        if spec.labels and not _matches(s, spec):
            continue
        ts = s.timestamp_ms or 0
        if ts > best_ts:
            best, best_ts = s, ts
    if best is None:
        raise _Bad(f"no sample of {spec.name!r} has labels {dict(spec.labels)}")
    return best


def latest_lora(text: str, spec: MetricSpec) -> Sample:
    """GIE's LoRASpec.getLatestMetric: the matching sample with the largest value (its timestamp)."""
    found = samples(text, spec.name, True)
    if not found:
        raise _Missing(f"metric family {spec.name!r} not found")
    best: Sample | None = None
    best_value = -1.0
    for s in found:
        if spec.labels and not _matches(s, spec):
            continue
        if s.value > best_value:
            best, best_value = s, s.value
    if best is None:
        raise _Bad(f"no sample of {spec.name!r} has labels {dict(spec.labels)}")
    return best


def _first(text: str, specs: tuple[MetricSpec, ...]) -> Sample:
    """The first spec of a fallback group whose family is on the page."""
    missing = []
    for spec in specs:
        try:
            return latest(text, spec)
        except _Missing:
            missing.append(spec.name)
    names = " or ".join(repr(n) for n in missing)
    raise _Missing(f"metric family {names} not found")


def _as_int(value: float, what: str) -> int:
    if math.isnan(value) or math.isinf(value):
        raise _Bad(f"{what}: value {value} is not a number")
    return int(value)


def _int_label(labels: dict[str, str], key: str) -> int | None:
    text = labels.get(key, "")
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise _Bad(f"label {key}={text!r} is not an integer") from None


def _adapters(csv: str) -> dict[str, int]:
    return {name: 0 for part in csv.split(",") if (name := part.strip())}


def parse_metrics(text: str, spec: EngineSpec, previous: Metrics | None = None) -> ParseResult:
    """Read `spec`'s metrics from Prometheus text. Never raises: problems become errors/warnings.

    The result's `update_time` is left as in `previous` (or 0); the caller stamps the scrape time."""
    metrics = replace(previous) if previous is not None else Metrics()
    if previous is not None:
        metrics.active_models = dict(previous.active_models)
        metrics.waiting_models = dict(previous.waiting_models)
    errors: list[str] = []
    warnings: list[str] = []
    if not isinstance(text, str):
        return ParseResult(metrics, (f"metrics page is {type(text).__name__}, not text",))
    try:
        for what, group in (("queued requests", spec.queued), ("running requests", spec.running)):
            if group:
                try:
                    value = _as_int(_first(text, group).value, group[0].name)
                except _Bad as err:
                    errors.append(f"{what}: {err}")
                else:
                    if what == "queued requests":
                        metrics.waiting_queue_size = value
                    else:
                        metrics.running_requests_size = value
        if spec.kv_usage:
            try:
                kv = _first(text, spec.kv_usage).value
                if math.isnan(kv):
                    raise _Bad(f"{spec.kv_usage[0].name}: value is NaN")
                metrics.kv_cache_usage_percent = kv
            except _Bad as err:
                errors.append(f"KV-cache usage: {err}")
        if spec.lora is not None:
            try:
                _read_lora(text, spec.lora, metrics)
            except _Bad as err:
                warnings.append(f"LoRA info: {err}")
        if spec.cache_info is not None:
            try:
                labels = latest(text, spec.cache_info, need_labels=True).labels or {}
                block = _int_label(labels, spec.cache_block_size_label)
                blocks = _int_label(labels, spec.cache_num_blocks_label)
                metrics.cache_block_size = block or 0
                if blocks is not None:
                    metrics.cache_num_blocks = blocks
            except _Bad as err:
                warnings.append(f"cache info: {err}")
        for what, gauge in (("cache block size", spec.cache_block_size), ("cache blocks", spec.cache_num_blocks)):
            if gauge is None:
                continue
            try:
                value = _as_int(latest(text, gauge).value, gauge.name)
            except _Bad as err:
                warnings.append(f"{what}: {err}")
                continue
            if gauge is spec.cache_block_size:
                metrics.cache_block_size = value
            else:
                metrics.cache_num_blocks = value
    except Exception as err:  # a parser bug must not kill the scrape loop
        errors.append(f"internal error while parsing metrics: {type(err).__name__}: {err}")
    return ParseResult(metrics, tuple(errors), tuple(warnings))


def _read_lora(text: str, spec: MetricSpec, metrics: Metrics) -> None:
    labels = latest_lora(text, spec).labels or {}
    metrics.active_models = _adapters(labels.get(LORA_RUNNING_LABEL, ""))
    metrics.waiting_models = _adapters(labels.get(LORA_WAITING_LABEL, ""))
    max_lora = _int_label(labels, LORA_MAX_LABEL)
    if max_lora is not None:
        metrics.max_active_models = max_lora
