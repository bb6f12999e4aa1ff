"""Pods that come and go through a running gateway: the admin route and its token, `epp pods
add|remove|list`, a watched pods file beside run-time pods, and draining — a long stream in flight on
a removed pod completes while new requests go elsewhere. Real Ray, real Serve gateway, simulated
vLLM pods on 127.0.0.1; one deployment for the module."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import yaml
from fastapi import FastAPI
from fastapi.testclient import TestClient

from serve_app.admin.api import AdminApi, admin_router
from serve_app.cli import commands as cli
from tests.conftest import GATEWAY_TEST_PORT

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TOKEN = "admin-secret-for-tests-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def sim():
    from ray_epp.simulator import make_pod_configs, start_sim_pods_in_thread

    cluster = start_sim_pods_in_thread(make_pod_configs(3, max_num_seqs=8), time_scale=1.0, seed=3)
    yield cluster
    cluster.stop()


def entry(sim, i: int) -> dict:
    p = sim.pods[i]
    return {"name": p.name, "address": "127.0.0.1", "port": p.port, "labels": p.labels}


def write_pods(path, pods: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(pods))
    tmp.replace(path)


@pytest.fixture(scope="module")
def pods_file(tmp_path_factory, sim):
    path = tmp_path_factory.mktemp("pods") / "pods.yaml"
    write_pods(path, [entry(sim, 0), entry(sim, 1)])
    return path


# Its own deployment: its pods come from a watched pods file the tests rewrite.
@pytest.fixture(scope="module")
def gateway(ray_session, sim, pods_file):
    from serve_app.cli.launch import EppDeployment, LaunchSpec

    spec = LaunchSpec(
        config_path="default",
        pods_path=str(pods_file),
        watch_pods=True,
        settings={"admin_token": TOKEN},
        port=GATEWAY_TEST_PORT,
    )
    dep = EppDeployment.start(spec)
    yield dep
    dep.stop()


@pytest.fixture()
def epp(gateway, monkeypatch, capsys):
    """`epp pods ...` in this process against the gateway: (exit code, stdout, stderr)."""
    monkeypatch.setenv("EPP_ADMIN_TOKEN", TOKEN)

    def run(*args: str) -> tuple[int, str, str]:
        code = cli.main(["pods", args[0], "--url", gateway.url, *args[1:]])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def pods_of(client) -> dict[str, dict]:
    return {p["name"]: p for p in client.get("/admin/pods", headers=AUTH).json()["pods"]}


def wait_until(predicate, timeout_s: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached in {timeout_s} s (last: {last!r})")


def ready_endpoints(client) -> int:
    return client.get("/ready").json()["ready_endpoints"]


def test_admin_routes_refuse_without_the_token(client):
    no_auth = client.get("/admin/pods")
    assert no_auth.status_code == 401 and no_auth.headers["www-authenticate"] == "Bearer"
    assert no_auth.json()["error"]["type"] == "authentication_error"
    for headers in ({"Authorization": "Bearer wrong-token-wrong-token"}, {"Authorization": f"Bearer {TOKEN}x"}):
        wrong = client.get("/admin/pods", headers=headers)
        assert wrong.status_code == 403 and wrong.json()["error"]["type"] == "permission_error"
    assert client.get("/admin/pods", headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
    # a refused change changes nothing
    assert client.post("/admin/pods", json={"name": "x", "address": "127.0.0.1", "port": 9}).status_code == 401
    assert client.delete("/admin/pods/sim-0", headers={"Authorization": "Bearer nope"}).status_code == 403
    assert set(pods_of(client)) == {"sim-0", "sim-1"}
    # the OpenAI routes do not take the admin token as a key, nor need it
    assert client.get("/v1/models").status_code == 200


def test_admin_routes_are_off_without_a_token():
    app = FastAPI()
    app.include_router(admin_router(lambda: AdminApi(None, None)))
    with TestClient(app) as local:
        for method, path in (("GET", "/admin/pods"), ("POST", "/admin/pods"), ("DELETE", "/admin/pods/a")):
            resp = local.request(method, path, headers=AUTH)
            assert resp.status_code == 404, (method, path)
            assert resp.json()["error"]["type"] == "not_found_error"


def test_bad_admin_bodies_are_openai_shaped_400s(client):
    for body in (b"{", b'{"name": "x"}', b'{"name": "x", "address": "h", "port": 70000}', b"[]"):
        resp = client.post("/admin/pods", content=body, headers={**AUTH, "content-type": "application/json"})
        assert resp.status_code == 400, body
        assert resp.json()["error"]["code"] == "BadRequest"
    assert client.delete("/admin/pods/sim-0?drain=maybe", headers=AUTH).status_code == 400
    assert client.delete("/admin/pods/nobody", headers=AUTH).status_code == 404


def test_epp_pods_add_list_remove(client, epp, sim):
    code, out, err = epp("add", "sim-2", f"127.0.0.1:{sim.pods[2].port}", "--label", "tier=gold")
    assert (code, out.strip()) == (0, "pod sim-2 added"), err
    wait_until(lambda: ready_endpoints(client) == 3, what="sim-2 routable")
    code, out, _ = epp("list")
    assert code == 0
    lines = {line.split()[0]: line.split() for line in out.splitlines()[1:] if not line.startswith("pod source")}
    assert lines["sim-2"][2:4] == ["ready", "runtime"] and "tier=gold" in lines["sim-2"][4]
    assert lines["sim-0"][3].startswith("file:")
    assert "pod source file:" in out and ": ok, 2 pods" in out

    # the watched file owns its pods: the admin route may not remove one behind its back
    code, _, err = epp("remove", "sim-0")
    assert code == 1 and "409" in err and "belongs to pod source file:" in err
    code, out, _ = epp("list", "--json")
    assert json.loads(out)["sources"][0]["ok"] is True

    code, out, err = epp("remove", "sim-2", "--wait", "30")
    assert code == 0 and "sim-2 has left" in out, (out, err)
    assert "sim-2" not in pods_of(client)
    assert ready_endpoints(client) == 2

    code, _, err = epp("remove", "sim-2")
    assert code == 1 and "404" in err
    code, _, err = epp("list", "--url", "http://127.0.0.1:9")
    assert code == 2 and "can not reach" in err


def test_epp_pods_refuses_a_wrong_token(epp, monkeypatch):
    monkeypatch.setenv("EPP_ADMIN_TOKEN", "not-the-token-at-all")
    code, _, err = epp("list")
    assert code == 1 and "403" in err


def test_a_drained_pod_finishes_its_stream_and_gets_no_new_requests(client, epp, sim, pods_file):
    # only sim-2 (a run-time pod) in the pool, so the long stream lands there
    assert epp("add", "sim-2", f"127.0.0.1:{sim.pods[2].port}")[0] == 0
    write_pods(pods_file, [])
    wait_until(lambda: set(pods_of(client)) == {"sim-2"}, what="the file's pods gone")
    wait_until(lambda: ready_endpoints(client) == 1, what="only sim-2 routable")
    body = {"model": MODEL, "prompt": "tell me a long story", "max_tokens": 400, "stream": True, "ignore_eos": True}
    with (
        httpx.Client(base_url=client.base_url, timeout=60) as streamer,
        streamer.stream("POST", "/v1/completions", json=body) as stream,
    ):
        assert stream.status_code == 200
        assert stream.headers["x-gateway-destination-endpoint"].endswith(f":{sim.pods[2].port}")
        chunks = stream.iter_lines()
        first = next(chunks)
        assert first.startswith("data: ")

        write_pods(pods_file, [entry(sim, 0), entry(sim, 1)])  # the others come back
        wait_until(lambda: ready_endpoints(client) == 3, what="sim-0 and sim-1 back")
        code, out, _ = epp("remove", "sim-2")  # drain
        assert code == 0 and "draining" in out
        assert pods_of(client)["sim-2"]["state"] == "draining"
        wait_until(lambda: ready_endpoints(client) == 2, what="sim-2 out of every replica's view")

        ports = {str(sim.pods[0].port), str(sim.pods[1].port)}
        for i in range(6):
            resp = client.post("/v1/completions", json={"model": MODEL, "prompt": f"new {i}", "max_tokens": 2})
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-gateway-destination-endpoint"].rsplit(":", 1)[1] in ports
        assert pods_of(client)["sim-2"]["state"] == "draining"  # its stream still runs

        rest = [line for line in chunks if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    tokens = [json.loads(line[6:]) for line in [first, *rest[:-1]]]
    assert not any("error" in t for t in tokens)
    assert sum(len(t["choices"]) for t in tokens) >= 400  # every token arrived: the drain cut nothing
    wait_until(lambda: "sim-2" not in pods_of(client), what="sim-2 gone once its stream ended")
