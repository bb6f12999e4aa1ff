"""The Grafana dashboard (deploy/grafana/ray-epp.json) and the alert rules
(deploy/prometheus/alerts.yaml) against a real Prometheus: Debian's `prometheus` binary scrapes a
running deployment's /metrics every second (three simulated vLLM pods on 127.0.0.1 that publish
KV events, flow control on, two profile shards) under a short load of every request kind, loads
the alert rules, and every PromQL expression of the dashboard and of the rules is evaluated through
Prometheus's HTTP API: each parses, each dashboard query returns data, each rule evaluates without
error, and every family they name is one /metrics exports (a renamed family fails here)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import GATEWAY_TEST_PORT
from tests.serve_app import test_metrics_e2e
from tests.serve_app.deployments import wait_until

pytestmark = pytest.mark.ray

# test_metrics_e2e.py's deployment (flow control, prefix indexes, KV events, two profile shards),
# started once for both modules.
E2E_SETUP = test_metrics_e2e.E2E_SETUP

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "ray-epp.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
ALERTS_TEST = ROOT / "deploy" / "prometheus" / "alerts_test.yaml"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SHARED = "You are a careful assistant. Read the whole report below and answer the question at its end. " * 6
# Grafana's $__rate_interval, as Prometheus gets it here: the whole load lies inside it.
RATE_INTERVAL = "1m"
FAMILY = re.compile(r"\b(?:inference|llm_d|ray_epp)_[a-z0-9_]+")


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel, $__rate_interval substituted."""
    out = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"].replace("$__rate_interval", RATE_INTERVAL)))
    return out


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def families_in(expr: str) -> set[str]:
    """The families an expression reads (label names in `by (...)` and matchers left out)."""
    bare = re.sub(r"\{[^}]*\}", "", re.sub(r"\b(?:by|without)\s*\([^)]*\)", "", expr))
    return {family_of(n) for n in FAMILY.findall(bare)}


def family_of(name: str) -> str:
    """The catalogue's family a sample name belongs to (a histogram's _bucket/_sum/_count)."""
    return re.sub(r"_(bucket|sum|count)$", "", name)


def test_every_family_the_dashboard_and_alerts_name_is_in_the_catalogue():
    """Without Prometheus: a family renamed in actors/metric_families/ fails here at once."""
    from actors.metric_families import FAMILIES

    exprs = [e for _, e in dashboard_exprs()] + [r["expr"] for r in alert_rules()]
    names = set().union(*map(families_in, exprs))
    assert names, "no family found in the dashboard"
    unknown = sorted(n for n in names if n not in FAMILIES or not FAMILIES[n].exposed)
    assert not unknown, f"not exported on /metrics: {unknown}"


def test_every_dashboard_panel_has_a_query_and_a_unique_id():
    panels = json.loads(DASHBOARD.read_text())["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        if p["type"] != "row":
            assert p.get("targets"), p["title"]


def test_the_alerts_fire_on_the_series_they_are_for():
    """promtool's rule unit tests (deploy/prometheus/alerts_test.yaml): no ready pod, an error
    ratio, a stale pod, KV-event gaps fire, with their labels and annotations; a healthy gateway's
    series fire nothing."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("`promtool` is not installed (it comes with Debian's prometheus; .ci/run installs it)")
    out = subprocess.run([promtool, "test", "rules", str(ALERTS_TEST)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


# ---- against a real Prometheus --------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def prometheus(gateway, tmp_path_factory):
    """A Prometheus scraping the gateway every second and evaluating the alert rules every second;
    its HTTP API's base URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the `prometheus` binary is not installed (apt-get install prometheus; .ci/run installs it)")
    work = tmp_path_factory.mktemp("prometheus")
    port = _free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {"job_name": "ray-epp", "static_configs": [{"targets": [f"127.0.0.1:{GATEWAY_TEST_PORT}"]}]}
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (work / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready():
            assert proc.poll() is None, (work / "prometheus.log").read_text()[-2000:]
            try:
                return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout_s=30, every_s=0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def query(url: str, expr: str) -> list:
    """The instant query's result vector; AssertionError naming the expression if it fails."""
    resp = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body = resp.json()
    assert resp.status_code == 200 and body["status"] == "success", (expr, body)
    return body["data"]["result"]


@pytest.fixture(scope="module")
def loaded(gateway, prometheus):
    """Prometheus's URL once it has scraped the gateway through a short load: completions and chat,
    streamed and not, a shared prefix, and one unknown model (an error code)."""
    with httpx.Client(base_url=gateway.url, timeout=60) as client:
        wait_until(lambda: client.get("/ready").status_code == 200, timeout_s=20, every_s=0.25)
        wait_until(lambda: query(prometheus, 'up{job="ray-epp"} == 1'), timeout_s=15, every_s=0.25)
        usage = {"stream_options": {"include_usage": True}}
        deadline = time.monotonic() + 6  # a few scrapes' worth, so every rate has two points
        i = 0
        while time.monotonic() < deadline or i < 12:
            prompt = (SHARED if i % 2 else f"A question of its own, number {i}, about nothing at all. ") + f"Q{i}?"
            chat = {"messages": [{"role": "user", "content": prompt}]}
            for path, body in (
                ("/v1/completions", {"prompt": prompt, "stream": True, **usage}),
                ("/v1/chat/completions", {**chat, "stream": i % 2 == 0, **usage}),
            ):
                resp = client.post(path, json={"model": MODEL, "max_tokens": 4 + i % 5, **body})
                assert resp.status_code == 200, resp.text
            i += 1
        assert client.post("/v1/completions", json={"model": "no-such-model", "prompt": "x"}).status_code == 404
        sent = 2 * i
    # the gateway's page sums what replicas and actors pushed (once a second): wait for the last
    wait_until(
        lambda: (
            query(prometheus, f"sum(inference_objective_request_total) >= {sent}")
            and query(prometheus, "sum(inference_objective_request_error_total) >= 1")
            and query(prometheus, "sum(inference_extension_prefix_indexer_hit_ratio_count) > 0")
        ),
        timeout_s=15,
        every_s=0.25,
    )
    time.sleep(2)  # two more scrapes: every rate window ends on the load's last samples
    return prometheus


def test_every_dashboard_query_parses_and_returns_data(loaded):
    empty = []
    for title, expr in dashboard_exprs():
        if not query(loaded, expr):
            empty.append(f"{title}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_a_renamed_family_leaves_its_panel_without_data(loaded):
    """The check above has teeth: the same query with its family renamed returns nothing."""
    title, expr = dashboard_exprs()[0]
    [family] = families_in(expr)
    assert query(loaded, expr), title
    assert query(loaded, expr.replace(family, family + "_renamed")) == []


def test_every_family_the_dashboard_and_alerts_name_is_scraped(loaded):
    """Alerts are quiet on a healthy pool (empty results): the families they read must still be
    the ones Prometheus scraped from /metrics."""
    resp = httpx.get(f"{loaded}/api/v1/label/__name__/values", timeout=10).json()
    scraped = {family_of(n) for n in resp["data"]}
    exprs = [e for _, e in dashboard_exprs()] + [r["expr"] for r in alert_rules()]
    named = set().union(*map(families_in, exprs))
    # a counter that has never moved has no series yet (no failure, no lost batch): it is in the
    # catalogue (the test above), not necessarily in Prometheus
    never_moved = {"ray_epp_profile_actor_failures_total"}
    missing = sorted(named - scraped - never_moved)
    assert not missing, f"named by the dashboard or alerts, not scraped: {missing}"


def test_every_alert_rule_parses_and_evaluates_in_prometheus(loaded):
    rules = alert_rules()
    for rule in rules:
        query(loaded, rule["expr"])  # parses and evaluates at once

    def evaluated():
        groups = httpx.get(f"{loaded}/api/v1/rules", timeout=10).json()["data"]["groups"]
        got = {r["name"]: r for g in groups for r in g["rules"]}
        done = len(got) == len(rules) and all(not r["lastEvaluation"].startswith("0001") for r in got.values())
        return got if done else None

    got = wait_until(evaluated, timeout_s=10, every_s=0.25)
    assert set(got) == {r["alert"] for r in rules}
    for name, rule in got.items():
        assert rule["health"] == "ok", (name, rule.get("lastError"))
    # a healthy pool under load: the pool and gateway alerts are quiet
    for name in ("RayEppNoReadyPods", "RayEppGatewayMetricsAbsent", "RayEppPodMetricsStale", "RayEppSnapshotStale"):
        assert got[name]["state"] == "inactive", (name, got[name])
