"""bench/soak.py kept from rotting: a tiny soak (2 pods, 1 replica, ~10 s, one pod fault) through
the real deployment; the report holds what docs/RELIABILITY.md quotes."""

from __future__ import annotations

import json

import pytest

from tests.conftest import GATEWAY_TEST_PORT

pytestmark = pytest.mark.ray


def test_a_tiny_soak_reports_requests_faults_memory_and_sizes(ray_session, tmp_path):
    from bench.soak import SoakConfig, run_soak

    cfg = SoakConfig(
        minutes=0.15, load=0.3, pods=2, replicas=1, port=GATEWAY_TEST_PORT, fault_every_s=3.0, pod_down_s=0.5,
        sample_every_s=2.0, capacity_s=0, faults=("pod",),
    )  # fmt: skip
    report = run_soak(cfg, tmp_path / "soak")
    assert report["sent"] > 5 and report["ok"] > 0
    assert [f["kind"] for f in report["faults"]] == ["pod"]
    assert report["faults"][0]["recovered_s"] is not None, "the killed pod came back into the pool"
    roles = {key.split("[")[0] for key in report["processes"]}
    assert {"driver", "ray::DatastoreActor", "ray::ProfileActor", "ray::ServeReplica:epp:Gateway"} <= roles, roles
    # the prefix index, named by the first plugin that reaches it (the default's filter, or its scorer)
    assert any(k.startswith("default/") and k.endswith(".index") for k in report["sizes"]), report["sizes"]
    assert report["sizes"]["metrics-hub/sources"]["max"] >= 1
    assert json.loads((tmp_path / "soak.json").read_text())["sent"] == report["sent"]
    for figure in ("soak.png", "soak_rss.png", "soak_errors.png"):
        assert (tmp_path / figure).stat().st_size > 0
