"""Faults and hostile input against a real Serve gateway (docs/RELIABILITY.md is the matrix).

One deployment with tight limits (so each fault shows in about a second), two simulated pods and a
third, `fake`, that relays everything to pod 0 (so it looks healthy and serves) until a test makes
it misbehave on completions: never answer ("hang"), or send one chunk of a stream and fall silent
("stall"); or stop answering anything, its metrics included, as a SIGSTOPped pod does ("freeze")."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import GATEWAY_TEST_PORT
from tests.serve_app.deployments import sim_pods, wait_until

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
API_KEY = "sk-reliability"
AUTH = {"authorization": f"Bearer {API_KEY}"}
SETTINGS = {
    "api_key": API_KEY,
    "body_read_timeout_s": 1.5,
    "max_in_flight": 16,
    "first_byte_timeout_s": 1.0,
    "stream_idle_timeout_s": 1.0,
    "max_retries": 2,
}


class FakePod:
    """Relays to a real pod; POSTs hang or stall (and GETs too: freeze) when `mode` says so. Counts
    the POSTs it got."""

    def __init__(self, mirror_url: str) -> None:
        self.mirror_url = mirror_url
        self.mode = "relay"
        self.posts = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._started.wait(10)

    def _run(self) -> None:
        from aiohttp import ClientSession, web

        async def relay_get(request: web.Request) -> web.Response:
            if self.mode == "freeze":  # stopped as a whole: its scrapes time out too
                await asyncio.sleep(3600)
            async with ClientSession() as s, s.get(self.mirror_url + request.path_qs) as r:
                return web.Response(body=await r.read(), status=r.status, content_type=r.content_type)

        async def post(request: web.Request) -> web.StreamResponse:
            self.posts += 1
            data = await request.read()
            if self.mode == "relay":
                async with ClientSession() as s:
                    headers = {"content-type": "application/json"}
                    async with s.post(self.mirror_url + request.path_qs, data=data, headers=headers) as r:
                        resp = web.StreamResponse(status=r.status, headers={"content-type": r.content_type})
                        await resp.prepare(request)
                        async for chunk in r.content.iter_any():
                            await resp.write(chunk)
                        await resp.write_eof()
                        return resp
            if self.mode == "stall":
                resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
                await resp.prepare(request)
                await resp.write(b'data: {"choices":[{"text":"x","index":0}]}\n\n')
            await asyncio.sleep(3600)
            raise AssertionError("unreachable")

        async def main() -> None:
            app = web.Application()
            app.router.add_get("/{tail:.*}", relay_get)
            app.router.add_post("/{tail:.*}", post)
            runner = web.AppRunner(app, handler_cancellation=True)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]
            self._stop = asyncio.Event()
            self._started.set()
            await self._stop.wait()
            await runner.cleanup()

        self._loop.run_until_complete(main())

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.fixture(scope="module")
def sim():
    yield from sim_pods(2, seed=11, max_num_seqs=8)


@pytest.fixture(scope="module")
def fake(sim):
    pod = FakePod(sim.pods[0].url)
    yield pod
    pod.stop()


# Its own deployment: a misbehaving fake pod among its pods; an API key and short timeouts.
@pytest.fixture(scope="module")
def gateway(ray_session, sim, fake):
    from actors.launcher import PodSpec
    from serve_app.cli.launch import EppDeployment, LaunchSpec

    pods = [PodSpec(name=p.name, address="127.0.0.1", port=p.port, labels=p.labels) for p in sim.pods]
    pods.append(PodSpec(name="fake", address="127.0.0.1", port=fake.port, labels={}))
    dep = EppDeployment.start(
        LaunchSpec(config_path="default", pods=pods, settings=SETTINGS, port=GATEWAY_TEST_PORT)
    )
    with httpx.Client(base_url=dep.url, timeout=10) as c:
        wait_until(lambda: c.get("/ready").json()["ready_endpoints"] == 3, timeout_s=30)
    yield dep
    dep.stop()


@pytest.fixture()
def client(gateway):
    with httpx.Client(base_url=gateway.url, timeout=30, headers=AUTH) as c:
        yield c




def is_openai_error(resp: httpx.Response, status: int, code: str | None = None) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text[:300])
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    if code is not None:
        assert err["code"] == code, err
    return err


def nested(depth: int) -> bytes:
    """A completion body with a field nesting `depth` lists deep (not the prompt, whose shape the
    gateway checks: an extra field, which it forwards as it came)."""
    return (
        b'{"model": "%s", "max_tokens": 1, "prompt": "hi", "extra_args": ' % MODEL.encode()
        + b"[" * depth
        + b"]" * depth
        + b"}"
    )


def raw_exchange(port: int, head: bytes, body: bytes, read_timeout_s: float) -> tuple[float, bytes]:
    """Send `head` + `body` on a plain socket; the seconds until the answer came, and its bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_timeout_s) as sock:
        sent = time.monotonic()
        sock.sendall(head + body)
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            return read_timeout_s, data
        return time.monotonic() - sent, data


def port_of(gateway) -> int:
    return urlsplit(gateway.url).port


def post_head(length: int, path: str = "/v1/completions") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {API_KEY}\r\ncontent-length: {length}\r\n\r\n"
    ).encode()


# ---- hostile bodies ----------------------------------------------------------------------------


def test_a_deeply_nested_body_fails_alone_not_its_batch_mates(client):
    """Bodies nested 800 deep parse but can not be pickled; sent among ordinary requests they
    used to fail whole batches (503 'profile actor unavailable: Could not pickle')."""
    normal = json.dumps({"model": MODEL, "prompt": "ordinary", "max_tokens": 1}).encode()

    def send(body: bytes) -> int:
        return client.post("/v1/completions", content=body, headers={"content-type": "application/json"}).status_code

    bodies = [nested(800) if i % 4 == 0 else normal for i in range(48)]
    with ThreadPoolExecutor(12) as pool:
        statuses = list(pool.map(send, bodies))
    assert [s for b, s in zip(bodies, statuses, strict=True) if b is normal] == [200] * 36
    assert [s for b, s in zip(bodies, statuses, strict=True) if b is not normal] == [400] * 12


@pytest.mark.parametrize("depth", [65, 990, 100_000])
def test_json_nested_past_the_limit_is_an_openai_400(client, depth):
    resp = client.post("/v1/completions", content=nested(depth), headers={"content-type": "application/json"})
    err = is_openai_error(resp, 400, "BadRequest")
    assert "deeper than the limit of 64" in err["message"]


def test_json_nested_within_the_limit_is_served(client):
    resp = client.post("/v1/completions", content=nested(60), headers={"content-type": "application/json"})
    assert "x-gateway-destination-endpoint" in resp.headers, resp.text  # forwarded (the pod judges it)


def test_a_declared_oversized_body_is_refused_before_it_is_read(gateway):
    """A 50 MB Content-Length gets 413 at once; the gateway does not wait for (or read) the body."""
    took, answer = raw_exchange(port_of(gateway), post_head(50_000_000), b"{" * 1000, read_timeout_s=5)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert took < 2


def test_a_body_that_never_finishes_gets_408(gateway):
    took, answer = raw_exchange(port_of(gateway), post_head(1000), b"{", read_timeout_s=8)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert 1.0 < took < 4


def test_idle_connections_are_shed_not_queued_and_ready_keeps_answering(gateway, client):
    """More slow-body connections than the replica's in-flight limit: the excess is shed at once
    (503 + Retry-After), /ready answers meanwhile, and everything is served once they time out."""
    socks = []
    try:
        for _ in range(24):
            s = socket.create_connection(("127.0.0.1", port_of(gateway)), timeout=10)
            s.sendall(post_head(1000) + b"{")
            socks.append(s)
        time.sleep(0.4)
        started = time.monotonic()
        ready = client.get("/ready")
        assert ready.status_code == 200 and time.monotonic() - started < 1
        shed = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1})
        is_openai_error(shed, 503, "ServiceUnavailable")
        assert shed.headers["retry-after"] == "1"
        statuses = []
        for s in socks:
            data = b""
            while b"\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            statuses.append(data.split(b" ")[1] if data else b"closed")
        assert set(statuses) <= {b"408", b"503"} and b"408" in statuses, statuses
    finally:
        for s in socks:
            s.close()
    resp = client.post("/v1/completions", json={"model": MODEL, "prompt": "after", "max_tokens": 1})
    assert resp.status_code == 200, resp.text


def test_oversized_headers_get_431(client):
    resp = client.post("/v1/completions", json={"model": MODEL, "prompt": "x"}, headers={"x-junk": "j" * 40_000})
    is_openai_error(resp, 431, "BadRequest")


# ---- the gateway's own errors -----------------------------------------------------------------


def test_unknown_route_and_wrong_method_are_openai_shaped(client):
    assert "/v1/nothing-here" in is_openai_error(client.get("/v1/nothing-here"), 404, "NotFound")["message"]
    assert "/v1/completions" in is_openai_error(client.get("/v1/completions"), 405, "BadRequest")["message"]


def test_a_pods_own_operational_routes_are_not_passed_through(client):
    """Any other path is a 404 naming it, never forwarded: a pod's own routes (the simulator's
    /reset_prefix_cache, vLLM's /sleep) stay out of a client's reach."""
    for path in ("/reset_prefix_cache", "/sleep", "/v1/load_lora_adapter"):
        err = is_openai_error(client.post(path, json={"model": MODEL}), 404, "NotFound")
        assert f"POST {path} is not a route" in err["message"]


def test_api_key_is_required_on_the_openai_routes(gateway):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
    with httpx.Client(base_url=gateway.url, timeout=30) as anon:
        is_openai_error(anon.post("/v1/completions", json=body), 401, "invalid_api_key")
        wrong = anon.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-wrong"})
        is_openai_error(wrong, 401, "invalid_api_key")
        assert anon.get("/health").status_code == 200  # probes need no key
        ok = anon.post("/v1/completions", json=body, headers=AUTH)
        assert ok.status_code == 200, ok.text


def test_the_anthropic_routes_take_the_key_as_anthropic_clients_send_it(gateway):
    """`x-api-key` (what the Anthropic SDK sends) opens /v1/messages; a wrong one is Anthropic's
    authentication_error, and it opens no OpenAI route."""
    import anthropic

    turn = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=API_KEY, max_retries=0)
    assert claude.messages.create(**turn).content[0].text
    assert claude.messages.count_tokens(model=MODEL, messages=turn["messages"]).input_tokens > 0
    with pytest.raises(anthropic.AuthenticationError) as err:
        anthropic.Anthropic(base_url=gateway.url, api_key="sk-wrong", max_retries=0).messages.create(**turn)
    assert err.value.body["error"]["type"] == "authentication_error"
    as_bearer = anthropic.Anthropic(base_url=gateway.url, auth_token=API_KEY, max_retries=0)
    assert as_bearer.messages.create(**turn).content[0].text
    with httpx.Client(base_url=gateway.url, timeout=30) as anon:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
        is_openai_error(anon.post("/v1/completions", json=body, headers={"x-api-key": API_KEY}), 401)


def test_trace_and_pick_are_off_by_default(client):
    resp = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1}, headers={"x-epp-debug": "1"}
    )
    assert resp.status_code == 200
    assert "x-epp-trace" not in resp.headers
    is_openai_error(client.post("/v1/pick", json={"model": MODEL, "prompt": "x"}), 404, "NotFound")


# ---- metrics ------------------------------------------------------------------------------------


def test_client_chosen_labels_do_not_grow_metrics(client):
    """Priorities, fairness ids and model names are the client's to choose: on /metrics, in every
    family, they stay within bounds (0 or an objective's priority, the first 32 fairness ids a
    replica sees, models the pool serves), whatever clients send."""
    from prometheus_client.parser import text_string_to_metric_families

    from serve_app.gateway.request_metrics import MAX_FAIRNESS_LABELS

    for p in range(1, 41):
        resp = client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "p", "max_tokens": 1},
            headers={"x-gateway-inference-priority": str(p), "x-gateway-inference-fairness-id": f"tenant-{p}"},
        )
        assert resp.status_code == 200
    far = client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "p", "max_tokens": 1},
        headers={"x-gateway-inference-priority": "99999999"},
    )
    is_openai_error(far, 400, "BadRequest")
    for i in range(5):  # models nobody serves
        unknown = client.post("/v1/completions", json={"model": f"no-such-model-{i}", "prompt": "p", "max_tokens": 1})
        assert unknown.status_code == 404
    text = client.get("/metrics").text
    priorities = set(re.findall(r'inference_objective_request_total\{[^}]*priority="([^"]*)"', text))
    assert priorities <= {"0", "other"}, priorities

    def chosen(text: str) -> tuple[dict[str, set[str]], set]:
        """Each label's values on the page, and the series that carry a label clients choose."""
        values: dict[str, set[str]] = {}
        series = set()
        for fam in text_string_to_metric_families(text):
            for sample in fam.samples:
                for name, value in sample.labels.items():
                    values.setdefault(name, set()).add(value)
                if {"priority", "fairness_id", "model_name"} & sample.labels.keys():
                    series.add((sample.name, tuple(sorted(sample.labels.items()))))
        return values, series

    values, series = chosen(text)
    assert values["priority"] <= {"0", "other", ""}, values["priority"]
    assert len(values["fairness_id"] - {"other", ""}) <= MAX_FAIRNESS_LABELS, values["fairness_id"]
    assert "other" in values["fairness_id"]  # 40 tenants and the default flow: the later ones are "other"
    for name in ("model_name", "target_model_name"):
        assert values[name] <= {MODEL, "other", "unknown"}, values[name]
    # More of the same with new values: no new series.
    for p in range(41, 61):
        headers = {"x-gateway-inference-priority": str(p), "x-gateway-inference-fairness-id": f"tenant-{p}"}
        resp = client.post("/v1/completions", json={"model": MODEL, "prompt": "p", "max_tokens": 1}, headers=headers)
        assert resp.status_code == 200
        client.post("/v1/completions", json={"model": f"no-such-model-{p}", "prompt": "p", "max_tokens": 1})
    assert chosen(client.get("/metrics").text)[1] == series


def test_running_requests_gauge_follows_streams(client):
    def running() -> float:
        text = client.get("/metrics").text
        pattern = r'inference_objective_running_requests\{model_name="' + re.escape(MODEL) + r'"\} (\S+)'
        m = re.search(pattern, text)
        return float(m.group(1)) if m else -1.0

    body = {"model": MODEL, "stream": True, "max_tokens": 300, "prompt": "count me"}
    with client.stream("POST", "/v1/completions", json=body) as resp:
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        assert running() >= 1.0
        for _ in lines:
            pass
    wait_until(lambda: running() == 0.0, timeout_s=5)


# ---- misbehaving pods (run last: they leave the fake pod counted busy for a while) ------------------


def prefix_homed_on(client: httpx.Client, fake: FakePod, tag: str) -> str:
    """A long prompt the router has sent to the fake pod while it still relays, so the prefix index
    holds it there and a request sharing it prefers the fake pod: the pod holding your prefix is
    the one that misbehaves. (A cold prompt need not go there: the default spreads new prefixes to
    the pod whose index entries are fewest.)"""
    fake.mode = "relay"
    for i in range(60):
        prompt = f"[{tag} {i}] " + " ".join(f"w{tag}{i}x{j}" for j in range(400))
        body = {"model": MODEL, "max_tokens": 1, "prompt": prompt}
        resp = client.post("/v1/completions", json=body)
        assert resp.status_code == 200, resp.text[:300]
        if resp.headers["x-gateway-destination-endpoint"].endswith(f":{fake.port}"):
            return prompt
    raise AssertionError("no cold prompt went to the fake pod in 60 tries")


def test_zz_a_hung_pod_is_left_after_the_first_byte_timeout(client, fake):
    """A pod that takes requests and never answers: a stream goes elsewhere after
    first_byte_timeout_s (1 s here) instead of waiting upstream_timeout_s (600 s)."""
    prefix = prefix_homed_on(client, fake, "hung")
    fake.mode = "hang"
    before = fake.posts
    for i in range(20):
        body = {"model": MODEL, "stream": True, "max_tokens": 2, "prompt": f"{prefix} hung {i}"}
        started = time.monotonic()
        with client.stream("POST", "/v1/completions", json=body, timeout=8) as resp:
            assert resp.status_code == 200
            assert not resp.headers["x-gateway-destination-endpoint"].endswith(f":{fake.port}")
            assert [line for line in resp.iter_lines() if line][-1] == "data: [DONE]"
        assert time.monotonic() - started < 4
        if fake.posts - before >= 2:
            break
    assert fake.posts - before >= 2, "the fake pod was never picked"


def test_zz_a_stream_that_falls_silent_ends_with_an_error_event(client, fake):
    prefix = prefix_homed_on(client, fake, "stall")
    fake.mode = "stall"
    for i in range(20):
        body = {"model": MODEL, "stream": True, "max_tokens": 2, "prompt": f"{prefix} stall {i}"}
        started = time.monotonic()
        with client.stream("POST", "/v1/completions", json=body, timeout=8) as resp:
            lines = [line for line in resp.iter_lines() if line]
            on_fake = resp.headers["x-gateway-destination-endpoint"].endswith(f":{fake.port}")
        if on_fake:
            assert time.monotonic() - started < 4
            error = json.loads(lines[-2].removeprefix("data: "))["error"]
            assert "no data for 1.0 s" in error["message"]
            assert lines[-1] == "data: [DONE]"
            return
    raise AssertionError("the fake pod was never picked")


def test_zz_a_frozen_pods_waiting_requests_move_once_it_is_unhealthy(client, fake):
    """A pod that stops answering anything (SIGSTOPped, its host unreachable) holds the non-streamed
    requests already sent to it, which no first-byte bound covers (their answer comes whole at the
    end): once the datastore calls it unhealthy (5 failed scrapes of 1 s) they are retried on
    another pod, long before the client's time-out, and none is lost."""
    prefix = prefix_homed_on(client, fake, "frozen")
    fake.mode = "freeze"
    before = fake.posts

    def send(i: int) -> tuple[int, str, float]:
        body = {"model": MODEL, "max_tokens": 2, "prompt": f"{prefix} frozen {i}"}
        started = time.monotonic()
        resp = client.post("/v1/completions", json=body, timeout=30)
        return resp.status_code, resp.headers.get("x-gateway-destination-endpoint", ""), time.monotonic() - started

    try:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(send, range(4)))
        assert fake.posts - before >= 1, "no request reached the frozen pod before it left the pool"
        for status, destination, seconds in answers:
            assert status == 200, answers
            assert not destination.endswith(f":{fake.port}"), answers
            assert seconds < 20, answers  # unhealthy after ~5 s; the client would wait 30 s
    finally:
        fake.mode = "relay"
        with httpx.Client(base_url=client.base_url, timeout=10) as c:
            wait_until(lambda: c.get("/ready").json()["ready_endpoints"] == 3, timeout_s=30)

