"""The end-to-end driver: a tiny shared-prefix workload through sglang-router (round_robin) to two
simulated pods in their own process; the records are what bench/metrics.py reads."""

import asyncio
import math
import subprocess
import sys

import pytest
from aiohttp import web

from bench.cli import main
from bench.e2e import TARGETS, E2EDriver, _wait_ready, failure_split
from bench.metrics import ERROR, OK, SHED
from bench.replay_client import replay
from bench.scenarios import SCENARIOS
from tests.bench import helpers


def test_e2e_driver_through_sglang_round_robin() -> None:
    make = TARGETS["sglang-round-robin"]
    assert make is not None
    if make(["http://127.0.0.1:1"], None, 1) is None:  # type: ignore[arg-type]
        pytest.skip("sglang-router is not installed")
    scenario = SCENARIOS["shared-prefix"]
    pods = scenario.pods()[:2]
    workload = scenario.workload(5.0, 0, 10)
    run = E2EDriver(time_scale=0.5, max_requests=10, timeout_s=30, warmup=2).run(
        "sglang-round-robin", pods, workload, 0
    )
    assert [o.request_id for o in run.outcomes] == [
        r.request_id for r in sorted(workload, key=lambda r: r.arrival_time)
    ]
    assert all(o.status == OK for o in run.outcomes), run.extra
    by_id = {r.request_id: r for r in workload}
    for o in run.outcomes:
        req = by_id[o.request_id]
        assert o.arrival == req.arrival_time
        assert o.output_tokens == req.max_tokens
        assert o.prompt_tokens > 0 and 0 <= o.cached_tokens <= o.prompt_tokens
        assert 0 < o.ttft < o.e2e and not math.isnan(o.itl) and o.itl > 0
        # model time: at least the simulated decode of every token, well under a second per token
        assert o.e2e > (o.output_tokens - 1) * o.itl * 0.9
    m = run.metrics
    assert m["requests"] == m["completed"] == 10 and m["errors"] == 0
    assert m["time_scale"] == 0.5 and m["ttft_ms"]["p50"] > 0 and m["output_throughput"] > 0


def test_a_target_that_exits_is_reported_not_waited_for() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(RuntimeError, match="exited with 0"):
        _wait_ready(proc, "http://127.0.0.1:1/health", 30)


def test_cli_rejects_an_unknown_e2e_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["shared-prefix", "--driver", "e2e", "--policies", "round-robin"]) == 2
    assert "unknown e2e target 'round-robin'" in capsys.readouterr().err


async def _answer(request: web.Request) -> web.StreamResponse:
    """A stand-in gateway on 127.0.0.1: each prompt names the way its answer goes."""
    how = (await request.json())["prompt"]
    if how in ("ttl", "503"):
        status, code = (429, "ResourceExhausted") if how == "ttl" else (503, "ServiceUnavailable")
        headers = {"x-llm-d-request-dropped-reason": "rejected-ttl-expired"} if how == "ttl" else {}
        body = {"error": {"message": f"said {how}", "type": "x", "param": None, "code": code}}
        return web.json_response(body, status=status, headers=headers)
    if how == "queued":
        await asyncio.sleep(30)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b'data: {"choices": [{"text": "a"}]}\n\n')
    if how == "cut":
        assert request.transport is not None
        request.transport.close()
        return resp
    if how == "error-event":
        await resp.write(b'data: {"error": {"message": "upstream failed", "code": "ServiceUnavailable"}}\n\n')
    if how == "streaming":
        await asyncio.sleep(30)
    await resp.write(b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}\n\n')
    await resp.write(b"data: [DONE]\n\n")
    return resp


def test_e2e_replay_says_why_each_request_failed() -> None:
    """ "N failed" is split: the gateway's status, code and dropped reason, a stream cut or ended
    with an error event, and what was still queued or streaming at the cut-off."""
    hows = ["ok", "ttl", "503", "cut", "error-event", "queued", "streaming"]
    workload = [helpers.req(f"r{i}", how, priority=1 if i % 2 else -1) for i, how in enumerate(hows)]

    async def run() -> list:
        app = web.Application()
        app.router.add_post("/v1/completions", _answer)
        runner = web.AppRunner(app, shutdown_timeout=0.2)  # the sleeping handlers are not waited for
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            outcomes, _ = await replay([f"http://127.0.0.1:{port}"], workload, 1.0, 1.0, 0)
        finally:
            await runner.cleanup()
        return outcomes

    outcomes = asyncio.run(run())
    why = {o.request_id: (o.status, o.reason) for o in outcomes}
    assert why == {
        "r0": (OK, ""),
        "r1": (SHED, "http 429 ResourceExhausted rejected-ttl-expired"),
        "r2": (ERROR, "http 503 ServiceUnavailable"),
        "r3": (ERROR, "stream cut: ClientPayloadError"),
        "r4": (ERROR, "stream error event ServiceUnavailable"),
        "r5": (ERROR, "unfinished at cut-off (no answer yet)"),
        "r6": (ERROR, "unfinished at cut-off (streaming)"),
    }
    assert "said 503" in outcomes[2].detail
    split = failure_split(outcomes, key=lambda o: "critical" if o.priority > 0 else "sheddable")
    assert split["shed: http 429 ResourceExhausted rejected-ttl-expired"] == {
        "n": 1, "example": outcomes[1].detail, "by": {"critical": 1},
    }  # fmt: skip
    assert sum(e["n"] for e in split.values()) == 6


def test_any_of_our_configs_is_a_gateway_target(tmp_path) -> None:
    """`epp-<config>` and `epp:<path>` name the gateway with that config, as in the cluster simulation."""
    from bench.e2e import target

    unsticky = target("epp-default-unsticky")
    assert unsticky is not None
    cmd, ready, _ = unsticky(["http://127.0.0.1:1"], tmp_path / "pods.json", 9)
    assert cmd[cmd.index("--config") + 1].endswith("bench/configs/default-unsticky.yaml")
    assert ready == "http://127.0.0.1:9/ready"
    mine = tmp_path / "mine.yaml"
    mine.write_text("apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n")
    cmd, _, _ = target(f"epp:{mine}")(["http://127.0.0.1:1"], tmp_path / "pods.json", 9)  # type: ignore[misc]
    assert cmd[cmd.index("--config") + 1] == str(mine)
    with pytest.raises(ValueError, match="unknown e2e target"):
        target("epp-no-such-config")


def test_a_config_path_target_that_fails_to_start_is_reported_with_its_log(tmp_path) -> None:
    """`epp:<path>` (slashes in the name) through the driver: the gateway refuses the config and
    exits; the run is every request failed, with the gateway's own words."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: no-such-plugin\n"
    )
    scenario = SCENARIOS["uniform"]
    workload = scenario.workload(5.0, 0, 3)
    driver = E2EDriver(time_scale=0.5, max_requests=3, timeout_s=30, warmup=0)
    run = driver.run(f"epp:{bad}", scenario.pods()[:1], workload, 0)
    assert [o.status for o in run.outcomes] == [ERROR] * 3
    assert "no-such-plugin" in run.extra["errors"]["start"]


def test_requests_that_bypass_the_router_go_to_a_pod_the_router_never_hears_of() -> None:
    """cache-pressure-shared's direct clients: end to end they are sent to a pod drawn at random
    (the pods' Service), the rest to the router, and `replay` sends each where it is told."""
    from bench.e2e import destinations
    from bench.workloads.shared_pool import DIRECT, TRAFFIC_HEADER, is_direct

    workload = [helpers.req(f"r{i}", "ok") for i in range(40)]
    for r in workload[::3]:
        r.headers[TRAFFIC_HEADER] = DIRECT
    pods = ["http://127.0.0.1:2", "http://127.0.0.1:3"]
    to = destinations(workload, ["http://127.0.0.1:1"], pods, is_direct, seed=0)
    assert [t in pods for t in to] == [is_direct(r) for r in workload]
    assert set(to[::3]) == set(pods)  # both pods drawn
    assert to == destinations(workload, ["http://127.0.0.1:1"], pods, is_direct, seed=0)  # seeded
    assert destinations(workload, ["a", "b"], pods, None, 0) == ["a", "b"] * 20

    async def run() -> tuple[list, dict[int, list[str]]]:
        seen: dict[int, list[str]] = {}
        runners = []

        @web.middleware
        async def record(request: web.Request, handler):  # type: ignore[no-untyped-def]
            port = request.transport.get_extra_info("sockname")[1]  # type: ignore[union-attr]
            seen.setdefault(port, []).append(request.headers.get("x-id", ""))
            return await handler(request)

        for _ in range(2):
            app = web.Application(middlewares=[record])
            app.router.add_post("/v1/completions", _answer)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            runners.append(runner)
        ports = [r.addresses[0][1] for r in runners]
        small = workload[:6]
        for r in small:
            r.headers["x-id"] = r.request_id
        try:
            outcomes, _ = await replay(
                [], small, 1.0, 5.0, 0, [f"http://127.0.0.1:{ports[i % 2]}" for i in range(len(small))]
            )
        finally:
            for runner in runners:
                await runner.cleanup()
        return outcomes, {ports.index(p): ids for p, ids in seen.items()}

    outcomes, seen = asyncio.run(run())
    assert all(o.status == OK for o in outcomes)
    assert {k: sorted(v) for k, v in seen.items()} == {0: ["r0", "r2", "r4"], 1: ["r1", "r3", "r5"]}
