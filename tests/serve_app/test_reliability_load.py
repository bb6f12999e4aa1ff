"""The gateway under hostile traffic (docs/RELIABILITY.md): a client that leaves mid-stream, 10x
the pods' capacity, and a few hundred fuzzed bodies. One deployment in front of two small
simulated pods (2 sequences each, max_model_len 1024, so no body can make a pod generate for long).

Outcomes are printed (`-s`) for the matrix; nothing here asserts speed, only bounds that tell a
working gateway from a broken one (a stream the pod keeps generating, a hang, a 500 in text)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler import ErrorCode
from tests.conftest import GATEWAY_TEST_PORT
from tests.fuzz.strategies import FUZZ, MODEL, RAW_BODIES, SCALARS, dumps

pytestmark = pytest.mark.ray

POD_HEADER = "x-inference-pod"
MAX_NUM_SEQS = 2
MAX_MODEL_LEN = 1024
# The gateway's own error codes: GIE's, and OpenAI's where GIE has none.
GATEWAY_CODES = {c.value for c in ErrorCode} | {"invalid_api_key", "model_not_found"}


@pytest.fixture(scope="module")
def sim():
    from ray_epp.simulator import make_pod_configs, start_sim_pods_in_thread

    pods = make_pod_configs(2, max_num_seqs=MAX_NUM_SEQS, max_model_len=MAX_MODEL_LEN)
    with start_sim_pods_in_thread(pods, time_scale=1.0, seed=13) as cluster:
        yield cluster


# Its own deployment: pods of MAX_NUM_SEQS sequences and MAX_MODEL_LEN tokens, the limits the fuzz hits.
@pytest.fixture(scope="module")
def gateway(ray_session, sim):
    from actors.launcher import PodSpec
    from serve_app.cli.launch import EppDeployment, LaunchSpec

    pods = [PodSpec(name=p.name, address="127.0.0.1", port=p.port, labels=p.labels) for p in sim.pods]
    settings_ = {"objectives": {"batch": -1, "chat": 1}, "first_byte_timeout_s": 10.0}
    dep = EppDeployment.start(LaunchSpec(pods=pods, settings=settings_, port=GATEWAY_TEST_PORT))
    yield dep
    dep.stop()


def running(sim) -> int:
    return sum(p.snapshot()["running_requests_size"] + p.snapshot()["waiting_queue_size"] for p in sim.pods)


def wait_until(predicate, timeout_s: float) -> float | None:
    """Seconds until predicate() held, or None."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.02)
    return None


def test_a_client_gone_mid_stream_cancels_the_upstream_and_the_pod_stops(gateway, sim):
    """1,000 tokens take the pod ~6 s; the client reads two chunks and closes. The gateway must
    close its upstream connection, and the pod abort the request (its running count drops)."""
    body = {"model": MODEL, "prompt": "tell me a long story", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=30) as client:
        for _ in range(2):
            with client.stream("POST", f"{gateway.url}/v1/completions", json=body) as resp:
                assert resp.status_code == 200
                chunks = resp.iter_raw()
                next(chunks), next(chunks)
                assert running(sim) == 1, "the pod is generating"
                left = time.monotonic()
            # the block closed the connection mid-stream
            stopped = wait_until(lambda: running(sim) == 0, timeout_s=10)
            print(f"\nclient gone mid-stream: the pod stopped generating {stopped:.2f} s later" if stopped else "")
            assert stopped is not None and stopped < 3.0, "the pod kept generating for a client that left"
            assert time.monotonic() - left < 5.0


def test_overload_at_10x_capacity_serves_critical_sheds_sheddable_and_nothing_hangs(gateway, sim):
    """Open-loop arrivals at 10x what the pods can finish (by the simulator's engine model), half
    critical (objective chat, priority 1), half sheddable (batch, -1), for 2 s."""
    from ray_epp.simulator import TimingConfig

    max_tokens = 50
    t = TimingConfig()
    per_request = max_tokens * (t.step_overhead_s + MAX_NUM_SEQS * t.decode_per_seq_s) + t.step_overhead_s
    capacity = len(sim.pods) * MAX_NUM_SEQS / per_request
    rate, seconds = 10 * capacity, 2.0
    body = {"model": MODEL, "prompt": "overload", "max_tokens": max_tokens, "ignore_eos": True}

    async def run() -> list[tuple[str, int, float]]:
        out: list[tuple[str, int, float]] = []
        timeout = httpx.Timeout(60.0)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=100)
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

            async def one(i: int, objective: str) -> None:
                start = time.monotonic()
                headers = {"x-gateway-inference-objective": objective}
                try:
                    r = await client.post(f"{gateway.url}/v1/completions", json=body, headers=headers)
                    out.append((objective, r.status_code, time.monotonic() - start))
                except httpx.HTTPError as err:
                    out.append((objective, -1, time.monotonic() - start))
                    print("overload: no answer:", repr(err))

            tasks = []
            n = int(rate * seconds)
            t0 = time.monotonic()
            for i in range(n):
                await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
                tasks.append(asyncio.create_task(one(i, "chat" if i % 2 == 0 else "batch")))
            await asyncio.gather(*tasks)
        return out

    results = asyncio.run(run())
    by = {(o, s): sum(1 for r in results if r[0] == o and r[1] == s) for o, s, _ in results}
    slowest = max(r[2] for r in results)
    print(f"\noverload: {len(results)} requests at {rate:.0f}/s (10x {capacity:.1f}/s) for {seconds:g} s: {by}; "
          f"slowest answer {slowest:.1f} s")  # fmt: skip
    critical = [s for o, s, _ in results if o == "chat"]
    sheddable = [s for o, s, _ in results if o == "batch"]
    assert all(s == 200 for s in critical), f"every critical request served: {by}"
    assert set(sheddable) <= {200, 429}, f"sheddable: served or refused with 429: {by}"
    assert sheddable.count(429) >= len(sheddable) // 2, f"most sheddable requests refused under 10x: {by}"


def error_shaped(resp: httpx.Response) -> str | None:
    """Why an error answer is not OpenAI-shaped (None when it is)."""
    try:
        err = resp.json()["error"]
    except (ValueError, KeyError, TypeError):
        return f"{resp.status_code} not OpenAI JSON: {resp.headers.get('content-type')} {resp.text[:100]!r}"
    if not isinstance(err, dict) or not isinstance(err.get("message"), str):
        return f"{resp.status_code} without error.message: {resp.text[:100]!r}"
    if POD_HEADER not in resp.headers and err.get("code") not in GATEWAY_CODES:
        return f"{resp.status_code} the gateway's own error without a GIE code: {resp.text[:100]!r}"
    return None


FUZZ_STATUSES: Counter[int] = Counter()
# Bodies the gateway forwards (a served model, a prompt or messages, a few tokens) with odd extra
# fields: what the pod answers must reach the client intact, errors included.
FORWARDED = st.builds(
    lambda chat, stream, extra: dumps(
        {"model": MODEL, "max_tokens": 4, "stream": stream, **extra,
         **({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"})}
    ),
    st.booleans(),
    st.booleans(),
    st.dictionaries(st.sampled_from(["temperature", "n", "stop", "logprobs", "stream_options", "ignore_eos", "user",
                                     "max_completion_tokens", "best_of", "echo", "top_p"]), SCALARS, max_size=3),
)  # fmt: skip


@pytest.fixture(scope="module")
def fuzz_client(gateway):
    with httpx.Client(base_url=gateway.url, timeout=20) as client:
        yield client
    print(f"\nlive fuzz: {sum(FUZZ_STATUSES.values())} bodies, statuses {dict(sorted(FUZZ_STATUSES.items()))}")


@settings(
    FUZZ,
    max_examples=150,
    deadline=None,
    suppress_health_check=[*FUZZ.suppress_health_check, HealthCheck.function_scoped_fixture],
)
@given(st.one_of(RAW_BODIES, FORWARDED), st.sampled_from(["/v1/completions", "/v1/chat/completions"]), st.booleans())
def test_fuzzed_bodies_get_2xx_or_an_openai_error_never_a_500_text_nor_a_hang(fuzz_client, raw, path, as_json):
    headers = {"content-type": "application/json"} if as_json else {"content-type": "text/plain"}
    try:
        resp = fuzz_client.post(path, content=raw, headers=headers)
    except httpx.TimeoutException:
        pytest.fail(f"no answer in 20 s to {raw[:120]!r}")
    FUZZ_STATUSES[resp.status_code] += 1
    if resp.status_code >= 400:
        problem = error_shaped(resp)
        assert problem is None, problem
        assert resp.status_code != 500 or POD_HEADER in resp.headers, f"a gateway 500: {resp.text[:200]}"
    else:
        assert 200 <= resp.status_code < 300
        if "text/event-stream" not in resp.headers.get("content-type", ""):
            json.loads(resp.content)
