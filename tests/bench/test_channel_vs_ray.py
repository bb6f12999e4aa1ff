"""The channel-vs-Ray benchmark's code path with a handful of calls, so it keeps working; and the
compiled-graph constraints it reports, so a Ray upgrade that lifts them is noticed."""

from __future__ import annotations

import pytest

from bench.channel_vs_ray import CANDIDATES, make_batch, markdown, probe_graph_constraints, run_benchmark


def test_payload_is_gateway_sized():
    import pickle

    one, eight = (len(pickle.dumps(make_batch(n))) for n in (1, 8))
    assert 2000 < one < 4000 and 8 * 2000 < eight < 8 * 4000


def test_every_candidate_round_trips_each_scenario(ray_session):
    result = run_benchmark(calls=6, rounds=1, concurrency=(1, 3), warmup=1, probes=False)
    cells = {(r["candidate"], r["batch"], r["concurrency"]) for r in result["rows"]}
    assert cells == {(c, b, k) for c in CANDIDATES for b in (1, 8) for k in (1, 3)}
    assert all(r["calls"] >= 6 and r["p50_ms"] > 0 for r in result["rows"])
    assert len(result["verdict"]) == 4 and all(v["best_ray"] != "channel" for v in result["verdict"])
    assert "| channel | 8 | 3 |" in markdown(result)


@pytest.mark.timeout(120)
def test_compiled_graph_constraints_hold(ray_session):
    probes = probe_graph_constraints(timeout_s=5.0, idle_s=1.0)
    assert probes["before_restart"].startswith("ok")
    # One graph per actor: a second caller's graph to the same callee never runs.
    assert probes["second_caller_call"].startswith("timeout")
    assert probes["first_caller_call_meanwhile"].startswith("ok")
    # A restarted callee ends the graph; only a new graph works again.
    assert probes["callee_restarted"]
    assert not probes["after_restart"].startswith("ok")
    assert probes["new_graph_call"].startswith("ok")
