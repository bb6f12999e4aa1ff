"""Why a request went where it went, asked after the fact: a real deployment (two gateway replicas
on one port, real profile actors, simulated vLLM pods on 127.0.0.1) recording every decision;
the admin route and `epp explain` find each request's record whichever replica decided it, with
each filter's survivors, each scorer's weighted score per endpoint, the pick and its margin; the
record keeps only the newest `decision_record_size` requests; the token guards it."""

from __future__ import annotations

import time

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from serve_app.admin.api import AdminApi, admin_router
from serve_app.cli import commands as cli
from serve_app.gateway.decision_record import FLUSH_INTERVAL_S, DecisionRecorder, explained
from serve_app.gateway.side_routes import DESTINATION_HEADER
from tests.serve_app.deployments import TWO_REPLICAS

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TOKEN = TWO_REPLICAS.spec["settings"]["admin_token"]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
KEPT = TWO_REPLICAS.spec["settings"]["decision_record_size"]
SENT = 14


# test_gateway_failover.py and extproc/test_extproc_failover.py run against the same setup, after
# this module: they kill a replica (and the former stops the gateway, last).
E2E_SETUP = TWO_REPLICAS


@pytest.fixture(scope="module")
def deployment(gateway):
    return gateway


@pytest.fixture(scope="module")
def sent(deployment) -> dict[str, str]:
    """request id -> the address the response says it was sent to; each on a new connection, so
    the shared port spreads them over both replicas, and after the last one's record reached the log
    (the log's order is the order records reach it: each replica sends its own every 0.2 s)."""
    out = {}
    for i in range(SENT):
        time.sleep(FLUSH_INTERVAL_S * 1.5)
        rid = f"why-{i}"
        with httpx.Client(base_url=deployment.url, timeout=60) as client:
            body = {"model": MODEL, "prompt": f"Request {i}: " + "tell me about routing. " * (i + 1), "max_tokens": 3}
            resp = client.post("/v1/completions", json=body, headers={"x-request-id": rid})
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-request-id"] == rid
        out[rid] = resp.headers[DESTINATION_HEADER]
    return out


def admin_get(deployment, path: str, headers: dict | None = None) -> httpx.Response:
    with httpx.Client(base_url=deployment.url, timeout=30) as client:  # a new connection: any replica
        return client.get(path, headers=AUTH if headers is None else headers)


def test_every_kept_request_is_explained_whichever_replica_decided_it(deployment, sent):
    kept = list(sent)[-KEPT:]
    gateways = set()
    for rid in kept:
        resp = admin_get(deployment, f"/admin/decisions/{rid}")
        assert resp.status_code == 200, resp.text
        [decision] = resp.json()["decisions"]
        gateways.add(decision["gateway"])
        assert decision["outcome"] == "scheduled" and decision["address"] == sent[rid]
        profile = decision["profiles"][decision["primary_profile"]]
        assert profile["picked"] == [decision["target"]] == [profile["winner"]]
        assert profile["scorers"], "the default profile scores"
        for ep, total in profile["totals"].items():  # the weighted scores add up to the totals
            assert sum(s["weighted"][ep] for s in profile["scorers"]) == pytest.approx(total, abs=1e-4)
            for s in profile["scorers"]:
                assert s["weighted"][ep] == pytest.approx(min(max(s["scores"][ep], 0), 1) * s["weight"], abs=1e-5)
        others = [t for ep, t in profile["totals"].items() if ep != profile["winner"]]
        assert profile["margin"]["by"] == pytest.approx(profile["totals"][profile["winner"]] - max(others), abs=1e-5)
        candidates = set(profile["totals"])
        if profile["filters"]:
            assert set(profile["filters"][-1]["kept"]) == candidates
    assert len(gateways) == 2, "both replicas decided some of the requests"


def test_the_record_keeps_the_newest_requests(deployment, sent):
    ids = list(sent)
    for rid in ids[: SENT - KEPT]:
        resp = admin_get(deployment, f"/admin/decisions/{rid}")
        assert resp.status_code == 404 and "keeps the newest 8" in resp.json()["error"]["message"]
    listed = admin_get(deployment, "/admin/decisions?limit=8").json()
    assert [d["request_id"] for d in listed["decisions"]] == ids[::-1][:KEPT]
    assert listed["kept"] == KEPT and listed["capacity"] == KEPT and listed["ratio"] == 1.0
    assert all(d["target"] and d["margin"] is not None for d in listed["decisions"])
    assert admin_get(deployment, "/admin/decisions?limit=0").status_code == 400


def test_the_admin_token_guards_the_record(deployment, sent):
    rid = list(sent)[-1]
    assert admin_get(deployment, f"/admin/decisions/{rid}", {}).status_code == 401
    assert admin_get(deployment, f"/admin/decisions/{rid}", {"Authorization": "Bearer nope"}).status_code == 403


def test_epp_explain_prints_the_decision_as_a_table(deployment, sent, monkeypatch, capsys):
    monkeypatch.setenv("EPP_ADMIN_TOKEN", TOKEN)
    rid = list(sent)[-1]
    assert cli.main(["explain", rid, "--url", deployment.url]) == 0
    out = capsys.readouterr().out
    assert f"request {rid}" in out and f"({sent[rid]})" in out
    assert "profile default (primary): picked" in out and " over " in out
    assert "TOTAL" in out and "<- picked" in out
    assert cli.main(["explain", "--url", deployment.url, "--limit", "3"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[0].split()[:2] == ["REQUEST", "ID"] and listing[1].startswith(rid)
    assert listing[-1] == f"{KEPT} of at most {KEPT} requests kept; sampling 1"
    assert cli.main(["explain", "why-0", "--url", deployment.url]) == 1
    assert "no decision recorded for request id 'why-0'" in capsys.readouterr().err


def test_explain_names_each_endpoint_with_its_scores(deployment, sent, sim, monkeypatch, capsys):
    monkeypatch.setenv("EPP_ADMIN_TOKEN", TOKEN)
    rid = list(sent)[-2]
    assert cli.main(["explain", rid, "--url", deployment.url]) == 0
    table = capsys.readouterr().out
    rows = [line.split() for line in table.splitlines() if line.strip().split(" ")[0] in {p.name for p in sim.pods}]
    assert rows, table
    picked = [r[0] for r in rows if r[-1] == "picked"]
    assert len(picked) == 1 and sent[rid].endswith(str(next(p.port for p in sim.pods if p.name == picked[0])))


# ---- without a deployment: the record off, sampling, a replica without the shared log ----------


def admin_app(decisions: DecisionRecorder | None) -> TestClient:
    app = FastAPI()
    api = AdminApi(TOKEN, None, decisions)
    app.include_router(admin_router(lambda: api))
    return TestClient(app)


def test_with_the_record_off_the_route_says_how_to_turn_it_on():
    resp = admin_app(None).get("/admin/decisions/x", headers=AUTH)
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "decision_record_off"
    assert "decision_record_ratio" in resp.json()["error"]["message"]


def test_sampling_keeps_a_share_of_the_ids_and_every_attempt_of_one():
    recorder = DecisionRecorder(0.25, 10, None, "test")
    ids = [f"req-{i}" for i in range(8000)]
    share = sum(map(recorder.samples, ids)) / len(ids)
    assert 0.23 < share < 0.27
    assert all(recorder.samples(i) == recorder.samples(i) for i in ids[:100])  # by id: retries agree
    assert not any(map(DecisionRecorder(0.0001, 10, None, "t").samples, ids[:100]))


def test_a_replica_without_the_shared_log_keeps_its_own_newest(monkeypatch):
    from scheduler import Endpoint, LLMRequest, ProfileRunResult, SchedulingResult
    from scheduler.trace import SchedulingTrace

    recorder = DecisionRecorder(1.0, 2, None, "test")
    a, b = Endpoint("a", "127.0.0.1", 1), Endpoint("b", "127.0.0.1", 2)
    for i in range(3):
        trace = SchedulingTrace(rounds=[["p"]])
        scorer = {"plugin": "s", "type": "queue-scorer", "weight": 2.0, "scores": {"a": 0.9, "b": 1.7}}
        totals = {"a": 1.8, "b": 2.0}
        trace.profiles["p"] = {"profile": "p", "filters": [], "scorers": [scorer], "totals": totals, "picked": ["b"]}
        recorder.record(LLMRequest(f"r{i}", "m", {}), SchedulingResult({"p": ProfileRunResult([b])}, "p"), trace)
    assert recorder._local.get("r0") == [] and len(recorder._local) == 2
    [record] = recorder._local.get("r2")
    view = explained(record)["profiles"]["p"]
    assert view["scorers"][0]["weighted"] == {"a": 1.8, "b": 2.0}  # 1.7 clamped to 1, times 2
    assert view["ranking"] == ["b", "a"] and view["margin"] == {"over": "a", "by": pytest.approx(0.2)}
    assert a.name in view["totals"]


def test_a_failed_decision_is_recorded_with_its_error():
    from scheduler import ErrorCode, LLMRequest, SchedulingError
    from scheduler.trace import SchedulingTrace

    recorder = DecisionRecorder(1.0, 4, None, "test")
    trace = SchedulingTrace(rounds=[["p"]])
    trace.profiles["p"] = {"profile": "p", "filters": [], "scorers": [], "totals": {}, "picked": [], "error": "none"}
    error = SchedulingError(ErrorCode.SERVICE_UNAVAILABLE, "no endpoint left")
    recorder.record(LLMRequest("r", "m", {}), None, trace, error)
    [record] = recorder._local.get("r")
    assert record["outcome"] == "failed" and record["target"] is None
    assert record["error"] == f"{ErrorCode.SERVICE_UNAVAILABLE.value}: no endpoint left"
    assert explained(record)["profiles"]["p"]["margin"] is None
