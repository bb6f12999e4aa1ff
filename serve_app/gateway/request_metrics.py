"""What a gateway replica records about each request, in GIE's and llm-d's families
(actors/metric_families/; what each means: docs/OBSERVABILITY.md).

A request is recorded once, under llm-d's labels (model, target model, fairness id, priority); GIE's
names are views of the same samples. The door calls, in order:

* `received` once the request is parsed: request count and body size. Its `RequestMetrics` rides
  in the request's derived data (`KEY`), which never leaves this process.
* `decided` once it is routed (the first decision; a retry's does not restart it): request
  processing time, arrival to decision. `error` for a refusal or a failure (then also processing).
* `scheduled` after every scheduling call: its latency, the attempt and its primary target, and a
  P/D handler's decision.
* `response_started`, `chunk` per piece relayed (first chunk, inter-chunk gaps, bytes, the
  gateway's own time on it), `finished` once however the response ends: duration, size, TTFT,
  tokens from the response's `usage` (prompt, completion, cached), normalised time per output
  token, a stream's time per output token.

Label values are bounded: models the pool serves (else "other", `GatewayCore.model_label`),
priorities that are 0 or an objective's, the first `MAX_FAIRNESS_LABELS` fairness ids a replica
sees (then "other"), endpoints of the pool. Each request allocates one `RequestMetrics`; its
label tuple is shared by every sample."""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from actors.metric_families import BUCKETS
from scheduler import CycleState, LLMRequest, SchedulingResult
from scheduler.data_keys import DataKey
from scheduler.flowcontrol.types import DEFAULT_FAIRNESS_ID, FAIRNESS_ID_HEADER
from scheduler.plugins.handlers.disagg import DISAGG_DECISION_KEY

KEY: DataKey[RequestMetrics] = DataKey("gateway/request-metrics")  # in LLMRequest.derived
MAX_FAIRNESS_LABELS = 32
OTHER = "other"
UNKNOWN = ("unknown", "unknown", "", "")  # a request refused before it was parsed

REQUESTS = "llm_d_epp_request_total"
ERRORS = "llm_d_epp_request_error_total"
DURATION = "llm_d_epp_request_duration_seconds"
REQUEST_SIZE = "llm_d_epp_request_size_bytes"
RESPONSE_SIZE = "llm_d_epp_response_size_bytes"
INPUT_TOKENS = "llm_d_epp_request_input_tokens"
OUTPUT_TOKENS = "llm_d_epp_request_output_tokens"
CACHED_TOKENS = "llm_d_epp_request_cached_tokens"
RUNNING = "llm_d_epp_request_running"
NTPOT = "llm_d_epp_request_ntpot_seconds"
TTFT = "ray_epp_request_ttft_seconds"
TPOT = "ray_epp_request_tpot_seconds"
ITL = "llm_d_epp_request_streaming_itl_seconds"
REQUEST_PROCESSING = "llm_d_epp_request_processing_duration_seconds"
RESPONSE_PROCESSING = "llm_d_epp_response_processing_duration_seconds"
SCHEDULER_E2E = "llm_d_epp_scheduler_e2e_duration_seconds"
ATTEMPTS = "llm_d_epp_scheduler_attempts_total"
IN_FLIGHT = "ray_epp_gateway_in_flight_requests"
DISAGG_DECISIONS = {  # llm-d's counter of each P/D handler's decisions
    "disagg-profile-handler": "llm_d_epp_disagg_decision_total",
    "pd-profile-handler": "llm_d_epp_pd_decision_total",
}
NO_NAMESPACE = ""  # Ray EPP's pods have no Kubernetes namespace
ITL_BUCKETS = BUCKETS[ITL]


class BoundedLabel:
    """The first `limit` distinct values pass; later ones are "other"."""

    __slots__ = ("limit", "seen")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self.seen:
            return value
        if len(self.seen) >= self.limit:
            return OTHER
        self.seen.add(value)
        return value


@dataclass(slots=True)
class RequestMetrics:
    labels: tuple[str, str, str, str]  # model, target model, fairness id, priority
    started: float  # perf_counter() when the request reached the door
    decided: float = 0.0  # when it was first routed (or refused)
    streaming: bool = False
    opened: float = 0.0  # when its response's headers came
    first_at: float = 0.0  # its first response chunk
    last_at: float = 0.0  # its latest response chunk
    response_bytes: int = 0
    work_s: float = 0.0  # the gateway's own time on a stream's chunks
    running: bool = False
    gaps: list[float] | None = None  # its chunk-gap histogram's counts (observed per chunk)


class GatewayMetrics:
    __slots__ = ("_attempt_labels", "_model_label", "_priority_label", "fairness", "recorder")

    def __init__(
        self,
        recorder: Any,
        model_label: Callable[[LLMRequest], str],
        priority_label: Callable[[int], str],
        in_flight: Callable[[], int] | None = None,
    ) -> None:
        self.recorder = recorder
        self._model_label = model_label
        self._priority_label = priority_label
        self.fairness = BoundedLabel(MAX_FAIRNESS_LABELS)
        self._attempt_labels: dict[tuple[str, str], tuple[str, str, str, str, str]] = {}
        if in_flight is not None:
            recorder.add_collector(lambda: {(IN_FLIGHT, ()): float(in_flight())})

    def labels(self, request: LLMRequest) -> tuple[str, str, str, str]:
        model = self._model_label(request)
        fairness_id = self.fairness(request.headers.get(FAIRNESS_ID_HEADER) or DEFAULT_FAIRNESS_ID)
        return model, model, fairness_id, self._priority_label(request.priority)

    # ---- the request ------------------------------------------------------------------------
    def received(self, request: LLMRequest, size: int, started: float | None = None) -> RequestMetrics:
        rec = RequestMetrics(self.labels(request), time.perf_counter() if started is None else started)
        request.derived.put(KEY, rec)
        self.recorder.inc(REQUESTS, rec.labels)
        self.recorder.observe(REQUEST_SIZE, size, rec.labels)
        return rec

    def decided(self, request: LLMRequest) -> None:
        rec = request.derived.get(KEY)
        if rec is not None and not rec.decided:
            rec.decided = time.perf_counter()
            self.recorder.observe(REQUEST_PROCESSING, rec.decided - rec.started)

    def error(self, request: LLMRequest | None, code: str) -> None:
        """The request ended in an error: a refusal at the door or in the queue, no endpoint, an
        upstream failure, or the model server's own error status (`code` its number)."""
        rec = None if request is None else request.derived.get(KEY)
        if rec is not None:
            labels = rec.labels
            if not rec.decided:  # refused before a decision: that was its processing
                rec.decided = time.perf_counter()
                self.recorder.observe(REQUEST_PROCESSING, rec.decided - rec.started)
        else:
            labels = UNKNOWN if request is None else self.labels(request)
        self.recorder.inc(ERRORS, (*labels, code))

    def scheduled(
        self,
        request: LLMRequest,
        result: SchedulingResult | None,
        seconds: float,
        cycle_state: CycleState | None = None,
        handler: Any = None,
    ) -> None:
        """One scheduling call: its latency, its outcome and primary target, and a P/D handler's
        decision (llm-d's disagg / pd decision counters)."""
        rec = self.recorder
        rec.observe(SCHEDULER_E2E, seconds)
        model = self._model_label(request)
        if result is None:
            rec.inc(ATTEMPTS, ("failure", model, "", NO_NAMESPACE, ""))
            return
        target = result.target
        key = (model, target.name)
        labels = self._attempt_labels.get(key)
        if labels is None:
            labels = self._attempt_labels[key] = ("success", model, target.name, NO_NAMESPACE, str(target.port))
        rec.inc(ATTEMPTS, labels)
        family = None if handler is None else DISAGG_DECISIONS.get(handler.type_name)
        if family is not None and cycle_state is not None:
            decision = cycle_state.read(DISAGG_DECISION_KEY)
            if decision and decision.get("decision"):
                rec.inc(family, (handler.name, handler.type_name, model, decision["decision"]))

    # ---- the response -----------------------------------------------------------------------
    def response_started(self, request: LLMRequest, streaming: bool, started: float) -> RequestMetrics:
        """Its response's headers came (`started`: when the request reached the door)."""
        rec = request.derived.get(KEY)
        if rec is None:  # a door that did not count it on arrival
            rec = RequestMetrics(self.labels(request), started)
            request.derived.put(KEY, rec)
        rec.streaming = streaming
        rec.opened = time.perf_counter()
        if not rec.running:
            rec.running = True
            self.recorder.add_gauge(RUNNING, rec.labels, 1.0)
        return rec

    def chunk(self, rec: RequestMetrics, size: int) -> float:
        """A chunk of `size` bytes arrived (before it is sent on); returns now (perf_counter)."""
        now = time.perf_counter()
        rec.response_bytes += size
        if not rec.first_at:
            rec.first_at = now
        elif rec.streaming:
            gaps = rec.gaps
            if gaps is None:
                gaps = rec.gaps = self.recorder.counts(ITL, rec.labels)
            gap = now - rec.last_at
            gaps[bisect_left(ITL_BUCKETS, gap)] += 1
            gaps[-1] += gap
        rec.last_at = now
        return now

    def finished(self, rec: RequestMetrics, usage: tuple[int, int, int] | None) -> None:
        """The response is over, however it ended; `usage`: (prompt, completion, cached tokens;
        cached -1 when not reported) when it carried one."""
        now = time.perf_counter()
        r, labels = self.recorder, rec.labels
        elapsed = now - rec.started
        r.observe(DURATION, elapsed, labels)
        r.observe(RESPONSE_SIZE, rec.response_bytes, labels)
        if rec.running:
            rec.running = False
            r.add_gauge(RUNNING, labels, -1.0)
        if rec.first_at:
            r.observe(TTFT, rec.first_at - rec.started, (*labels, "true" if rec.streaming else "false"))
            work = rec.work_s if rec.streaming else rec.last_at - rec.opened
            r.observe(RESPONSE_PROCESSING, work)
        if usage is None:
            return
        prompt, completion, cached = usage
        if prompt > 0:
            r.observe(INPUT_TOKENS, prompt, labels)
        if completion > 0:
            r.observe(OUTPUT_TOKENS, completion, labels)
            r.observe(NTPOT, elapsed / completion, labels)
        if cached >= 0:
            r.observe(CACHED_TOKENS, cached, labels)
        if rec.streaming and completion > 1 and rec.first_at:
            r.observe(TPOT, (rec.last_at - rec.first_at) / (completion - 1), labels)
