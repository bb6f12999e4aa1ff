"""bench/soak_tracemalloc.py: the allocation sites that grow, found inside a live Ray actor."""

from __future__ import annotations

import tracemalloc

import pytest

from bench.soak_tracemalloc import TracemallocProbe, growth, start_tracing


class Hoard:
    def __init__(self) -> None:
        self.kept: list[bytes] = []

    def grow(self, n: int) -> int:
        self.kept.extend(bytes(1024) + str(i).encode() for i in range(n))
        return len(self.kept)


def test_growth_names_the_site_that_grew_since_the_first_snapshot():
    was_tracing = tracemalloc.is_tracing()
    hoard = Hoard()
    try:
        start_tracing(hoard)
        assert growth(hoard)["sites"] == []  # the reference snapshot
        hoard.grow(2000)
        sites = growth(hoard)["sites"]
        top = sites[0]
        assert top["kib"] >= 2000 and top["blocks"] >= 2000, sites
        assert any("test_soak_tracemalloc.py" in frame for frame in top["at"]), top
    finally:
        if not was_tracing:
            tracemalloc.stop()


@pytest.mark.ray
def test_the_probe_traces_inside_a_live_actor_and_starts_again_after_a_restart(ray_session):
    import ray

    actor = ray.remote(max_restarts=1)(Hoard).remote()
    probe = TracemallocProbe(every=2)
    probe.step(actor, 0.0, {})  # starts tracing
    probe.step(actor, 1.0, {"n": 0})  # reference snapshot
    ray.get(actor.grow.remote(3000))
    probe.step(actor, 2.0, {"n": 3000})
    probe.step(actor, 3.0, {"n": 3000})
    rows = [r for r in probe.rows if r.get("sites")]
    assert rows and rows[-1]["sites"][0]["kib"] >= 3000, probe.rows
    assert rows[-1]["sizes"] == {"n": 3000} and rows[-1]["rss_mb"] > 0
    ray.kill(actor, no_restart=False)  # a fault: the actor comes back with no tracing and no snapshot
    ray.get(actor.grow.remote(1))
    probe.step(actor, 4.0, {})
    probe.step(actor, 5.0, {})
    assert "error" in probe.rows[-1] or probe.rows[-1].get("sites") == [], probe.rows[-1]
