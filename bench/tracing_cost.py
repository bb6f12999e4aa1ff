"""What OpenTelemetry tracing costs a gateway replica per request (docs/OBSERVABILITY.md "Traces",
docs/BENCHMARKS.md "Tracing: per request").

CPU time (`time.process_time`) of the tracing calls one request's life makes on the gateway
(serve_app/gateway/tracing.py: the root span from the client's headers, admission, schedule, the
traceparent for the profile call, one profile run's span from its outcome, the pick, the
forward with its traceparent, the first chunk, the end), at sampling ratios 0 (off: the request
path's no-op calls), 1 % and 100 %, with the SDK's BatchSpanProcessor and an exporter that drops
what it is given (the export itself runs on the processor's thread, not the request's).

    .venv/bin/python -m bench.tracing_cost
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from actors.protocol import ProfileOutcome
from scheduler import Endpoint, LLMRequest, ProfileRunResult, SchedulingResult
from serve_app.gateway.tracing import NO_SPANS, RequestTracing, current_spans

N = 20_000
CHUNKS = 16
TARGET = Endpoint("pod-0", "127.0.0.1", 8000)
RESULT = SchedulingResult({"default": ProfileRunResult([TARGET])}, "default")
HEADERS = {"content-type": "application/json", "user-agent": "bench"}  # no traceparent: the ratio decides


def tracing(ratio: float) -> RequestTracing | None:
    if ratio <= 0:
        return None
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class Drop(SpanExporter):
        def export(self, spans: Sequence) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=65536))
    return RequestTracing(ratio, "bench", provider=provider)


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


def measure(ratio: float) -> float:
    t = tracing(ratio)
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


def main() -> None:
    print(f"tracing CPU per request, {N:,} requests, {CHUNKS} chunks each; load {os.getloadavg()[0]:.2f}")
    for ratio in (0.0, 0.01, 1.0):
        print(f"  ratio {ratio:>5.0%}: {measure(ratio) * 1e6:7.2f} µs")


if __name__ == "__main__":
    main()
