"""What OpenTelemetry tracing costs a gateway replica per request (docs/OBSERVABILITY.md "Traces",
docs/BENCHMARKS.md "What do metrics, tracing and the decision record cost?").

CPU time (`time.process_time`) of the tracing calls one request's life makes on the gateway
(serve_app/gateway/tracing.py: the root span from the client's headers, admission, schedule, the
traceparent for the profile call, one profile run's span from its outcome, the pick, the
forward with its traceparent, the first chunk, the end), at each level: off (the ratio 0, the
default: the request path's no-op calls), opentelemetry not installed (a process where it can not
be imported), a tracer built but sampling 0 % of the requests that come without a sampled
traceparent (the sampling decision and a non-recording root span per request), 1 % and 100 %,
with the SDK's BatchSpanProcessor and an exporter that drops what it is given (the export runs
on the processor's thread, not the request's). Each level runs ROUNDS times, interleaved with
the others; the spread of a level's rounds is the noise.

    .venv/bin/python -m bench.tracing_cost
"""

from __future__ import annotations

import contextvars
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from actors.protocol import ProfileOutcome
from scheduler import Endpoint, LLMRequest, ProfileRunResult, SchedulingResult
from serve_app.gateway.tracing import NO_SPANS, RequestTracing, current_spans

N = 20_000
CHUNKS = 16
TARGET = Endpoint("pod-0", "127.0.0.1", 8000)
RESULT = SchedulingResult({"default": ProfileRunResult([TARGET])}, "default")
HEADERS = {"content-type": "application/json", "user-agent": "bench"}  # no traceparent: the ratio decides


def one_request(t: RequestTracing | None, req: LLMRequest) -> None:
    """The calls serve_app/gateway/core.py, ray_runner.py and exchange.py make for one request."""
    spans = (t.begin(HEADERS, "/v1/completions") if t is not None else None) or NO_SPANS
    spans.admission(req)
    spans = current_spans() or NO_SPANS  # _schedule_and_forward's look-up
    spans.schedule(0)
    live = current_spans()  # the profile runner's
    if live is not None:
        sent = live.profile_traceparent()
        now = time.time()
        live.profile_run("default", 0, ProfileOutcome(RESULT.primary, None, None, 1, now, now, {"traceparent": sent}))
    spans.decided(RESULT)
    headers = dict(HEADERS)
    spans.forward(TARGET, headers)
    if live is not None:  # the exchange's calls
        for _ in range(CHUNKS):
            live.chunk()
    spans.finish(200)


# The levels, each measured ROUNDS times, interleaved (off, not installed, 0 %, 1 %, 100 %, off, ...),
# so the spread of one level's rounds is the noise the others are compared with.
LEVELS: dict[str, float | None] = {
    "off (ratio 0, the default)": None,
    "not installed": None,
    "tracer built, 0 % sampled": 0.0,
    "1 %": 0.01,
    "100 %": 1.0,
}
ROUNDS = 5
# The "not installed" level runs in a process where opentelemetry can not be imported.
NOT_INSTALLED = """
import sys
sys.modules["opentelemetry"] = None  # `import opentelemetry...` raises ImportError
from serve_app.gateway.settings import GatewaySettings
from serve_app.gateway.tracing import request_tracing
assert request_tracing(GatewaySettings()) is None
try:
    request_tracing(GatewaySettings(tracing_sample_ratio=0.5))
    raise SystemExit("opentelemetry is importable")
except ValueError:
    pass
from bench.tracing_cost import measure
print(measure(None))
"""


def tracing_for(level: float | None) -> RequestTracing | None:
    """None: what `request_tracing` gives with the ratio 0 (nothing built); else a tracer sampling
    `level` (0.0: built, but sampling nothing that the client did not)."""
    if level is None:
        from serve_app.gateway.settings import GatewaySettings
        from serve_app.gateway.tracing import request_tracing

        assert request_tracing(GatewaySettings()) is None
        return None
    return tracing(level)


def tracing(ratio: float) -> RequestTracing:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class Drop(SpanExporter):
        def export(self, spans: Sequence) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=65536))
    return RequestTracing(ratio, "bench", provider=provider)


def measure(level: float | None) -> float:
    """CPU seconds per request at `level` (LEVELS' values), in a context of its own: a request's
    spans live in a context variable, as in the gateway, where each request is its own task."""
    return contextvars.Context().run(_measure, level)


def _measure(level: float | None) -> float:
    t = tracing_for(level)
    req = LLMRequest(request_id="r", target_model="m", body={"model": "m", "prompt": "x"})
    for _ in range(500):  # warm up
        one_request(t, req)
    start = time.process_time()
    for _ in range(N):
        one_request(t, req)
    per = (time.process_time() - start) / N
    if t is not None:
        t.shutdown()
    return per


def not_installed() -> float:
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", NOT_INSTALLED], cwd=root, capture_output=True, text=True, check=True, timeout=600
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()
    print(f"tracing CPU per request, {N:,} requests x {ROUNDS} rounds per level, {CHUNKS} chunks each")
    print(f"{when}; load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    rounds: dict[str, list[float]] = {name: [] for name in LEVELS}
    for _ in range(ROUNDS):
        for name, level in LEVELS.items():
            rounds[name].append(not_installed() if name == "not installed" else measure(level))
    print("| level | median µs | min-max µs (rounds) |")
    print("|---|---|---|")
    for name, values in rounds.items():
        us = sorted(v * 1e6 for v in values)
        print(f"| {name} | {statistics.median(us):.3f} | {us[0]:.3f}-{us[-1]:.3f} |")
    off, gone = (sorted(v * 1e6 for v in rounds[k]) for k in ("off (ratio 0, the default)", "not installed"))
    noise = max(off[-1] - off[0], gone[-1] - gone[0])
    diff = abs(statistics.median(off) - statistics.median(gone))
    print(f"off vs not installed: medians differ by {diff:.3f} µs; the rounds of each spread up to {noise:.3f} µs")
    end = os.getloadavg()
    print(f"load average at end {end[0]:.2f} {end[1]:.2f} {end[2]:.2f}")


if __name__ == "__main__":
    main()
