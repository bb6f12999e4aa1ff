"""What the metric families cost a gateway replica (docs/OBSERVABILITY.md, docs/BENCHMARKS.md
"Metrics: per request and per page").

1. Recording, per request, CPU: the gateway's `GatewayMetrics` calls for one request's life
   (arrival, one scheduling call, decision, response start, its chunks, end with usage) into a real
   `MetricsRecorder`, for a whole body and for a 64-chunk stream; against what the gateway recorded
   before (request count, scheduling latency and attempt, running gauge, TTFT, duration).
2. Reading the response's usage: a whole completion body parsed as JSON (a short one and a 16 KB
   one), a stream's tail.
3. Rendering /metrics: the summed state of 4 sources (replicas, profile actors) after traffic over
   8 pods and 1 model, with one fairness id and priority, and in every label set the bounds allow
   (33 fairness ids: 32 and `other`; 2 priorities), per page.

    .venv/bin/python -m bench.metrics_cost
"""

from __future__ import annotations

import json
import os
import time

from actors.metrics_hub import MetricsRecorder, render
from scheduler import Endpoint, LLMRequest, ProfileRunResult, SchedulingResult
from serve_app.gateway.request_metrics import MAX_FAIRNESS_LABELS, GatewayMetrics
from serve_app.gateway.usage import usage_counts_of_body, usage_counts_of_stream

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PODS = [Endpoint(f"pod-{i}", "10.0.0.1", 8000 + i) for i in range(8)]
CHUNK = b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" word"}]}\n\n'
USAGE = {
    "prompt_tokens": 812,
    "completion_tokens": 64,
    "total_tokens": 876,
    "prompt_tokens_details": {"cached_tokens": 640},
}


def body(text_chars: int) -> bytes:
    return json.dumps(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "model": MODEL,
            "choices": [{"index": 0, "text": "x" * text_chars, "finish_reason": "length"}],
            "usage": USAGE,
        }
    ).encode()


def gateway_metrics(recorder: MetricsRecorder) -> GatewayMetrics:
    return GatewayMetrics(recorder, lambda r: MODEL, lambda p: "0", lambda: 0)


def one_request(m: GatewayMetrics, req: LLMRequest, result: SchedulingResult, chunks: int, size: int) -> None:
    req.derived.clear()
    m.received(req, size)
    m.scheduled(req, result, 0.0004)
    m.decided(req)
    rec = m.response_started(req, chunks > 1, rec_start := time.perf_counter())
    del rec_start
    for _ in range(chunks):
        m.chunk(rec, len(CHUNK))
    m.finished(rec, (812, 64, 640))


def before(r: MetricsRecorder, req: LLMRequest, chunks: int) -> None:
    """What the gateway recorded per request before these families."""
    labels = (MODEL, MODEL)
    r.inc("llm_d_epp_request_total", (MODEL, MODEL, "default-flow", "0"))
    r.observe("llm_d_epp_scheduler_e2e_duration_seconds", 0.0004)
    r.inc("llm_d_epp_scheduler_attempts_total", ("success", MODEL, "pod-0", "", "8000"))
    r.add_gauge("llm_d_epp_request_running", (MODEL, MODEL, "default-flow", "0"), 1.0)
    if chunks > 1:
        r.observe("ray_epp_request_ttft_seconds", 0.05, (*labels, "default-flow", "0", "true"))
    r.observe("llm_d_epp_request_duration_seconds", 0.5, (MODEL, MODEL, "default-flow", "0"))
    r.add_gauge("llm_d_epp_request_running", (MODEL, MODEL, "default-flow", "0"), -1.0)


def cpu_us(fn, n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n * 1e6


def recording(n: int = 20000) -> dict[str, float]:
    out = {}
    req = LLMRequest("r1", MODEL, {"model": MODEL, "prompt": "hello"})
    result = SchedulingResult({"default": ProfileRunResult([PODS[0]])}, "default")
    for kind, chunks in (("whole body", 1), ("64-chunk stream", 64)):
        m = gateway_metrics(MetricsRecorder())
        out[f"now, {kind}"] = cpu_us(lambda m=m, c=chunks: one_request(m, req, result, c, 600), n)
        r = MetricsRecorder()
        out[f"before, {kind}"] = cpu_us(lambda r=r, c=chunks: before(r, req, c), n)
    return out


def usage(n: int = 20000) -> dict[str, float]:
    short, long = body(200), body(16000)
    tail = CHUNK * 40 + b"data: " + json.dumps({"choices": [], "usage": USAGE}).encode() + b"\n\ndata: [DONE]\n\n"
    return {
        f"whole body, {len(short)} B": cpu_us(lambda: usage_counts_of_body(short), n),
        f"whole body, {len(long)} B": cpu_us(lambda: usage_counts_of_body(long), n),
        f"stream tail, {len(tail)} B": cpu_us(lambda: usage_counts_of_stream(tail[-8192:]), n),
    }


def page(flows: int, priorities: tuple[int, ...], n: int = 20) -> dict[str, float]:
    states = []
    for source in range(4):
        r = MetricsRecorder()
        m = gateway_metrics(r)
        for f in range(flows):
            for prio in priorities:
                headers = {"x-gateway-inference-fairness-id": f"t{f}"}
                req = LLMRequest(f"r{source}-{f}-{prio}", MODEL, {"model": MODEL}, headers, prio)
                for pod in PODS:
                    one_request(m, req, SchedulingResult({"default": ProfileRunResult([pod])}, "default"), 4, 600)
        for i in range(20):  # plugin timings, as a profile actor has them
            r.observe("inference_extension_plugin_duration_seconds", 0.0001, ("Scorer", f"type-{i}", f"plugin-{i}"))
        states.append(r.state())
    text = render(states)
    start = time.process_time()
    for _ in range(n):
        render(states)
    return {
        "render ms per page": (time.process_time() - start) / n * 1e3,
        "page KiB": len(text) / 1024,
        "samples": float(sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))),
    }


def main() -> None:
    print(f"load average at start: {os.getloadavg()}")
    for title, rows, unit in (
        ("recording, CPU per request", recording(), "µs"),
        ("usage parse, CPU per response", usage(), "µs"),
        ("/metrics page, 1 fairness id, 1 priority", page(1, (0,)), ""),
        (
            f"/metrics page, {MAX_FAIRNESS_LABELS + 1} fairness ids, 2 priorities",
            page(MAX_FAIRNESS_LABELS + 1, (0, 1)),
            "",
        ),
    ):
        print(f"\n{title}")
        for name, value in rows.items():
            print(f"  {name:28s} {value:10.2f} {unit}")
    print(f"\nload average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
