"""Where a profile actor's memory goes: Python's `tracemalloc`, started inside the actor, and the
allocation sites that grew since a first snapshot, taken while the soak runs.

An RSS curve says that a process grows, not why. This runs inside the actor through Ray's
`__ray_call__` (a function called with the actor's instance), so the product carries no debug
hook: `bench.soak --tracemalloc` starts tracing in the default profile's first actor once the load
runs, takes the reference snapshot a minute later and, every minute after, keeps the sites that
grew most (by their last frames) with the actor's RSS and structure sizes beside them. Tracing
slows the actor and costs memory of its own (about as much again as what it traces): a diagnosis
run, not a soak whose latencies or RSS are reported."""

from __future__ import annotations

from typing import Any

FRAMES = 6  # frames kept per allocation: enough to see which structure a dict entry belongs to


def start_tracing(actor: Any, frames: int = FRAMES) -> bool:
    """Runs inside the actor: start tracing (a no-op when already started)."""
    import tracemalloc

    if not tracemalloc.is_tracing():
        tracemalloc.start(frames)
    return True


def growth(actor: Any, top: int = 12) -> dict[str, Any]:
    """Runs inside the actor: the first call keeps the reference snapshot; later calls return the
    `top` sites that grew most since it (KiB and blocks, each site by its last three frames)."""
    import gc
    import os
    import tracemalloc

    gc.collect()
    snapshot = tracemalloc.take_snapshot()
    traced_mb = tracemalloc.get_traced_memory()[0] / 2**20
    with open(f"/proc/{os.getpid()}/statm") as f:
        rss_mb = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    first = getattr(actor, "_soak_first_snapshot", None)
    if first is None:
        actor._soak_first_snapshot = snapshot
        return {"traced_mb": round(traced_mb, 1), "rss_mb": round(rss_mb, 1), "sites": []}
    sites = [
        {
            "kib": stat.size_diff // 1024,
            "blocks": stat.count_diff,
            "at": [f"{frame.filename.rsplit('/', 2)[-2:][-1]}:{frame.lineno}" for frame in stat.traceback][-3:],
        }
        for stat in snapshot.compare_to(first, "traceback")[:top]
    ]
    return {"traced_mb": round(traced_mb, 1), "rss_mb": round(rss_mb, 1), "sites": sites}


class TracemallocProbe:
    """Called once per soak sample: starts tracing at the first, snapshots at the sixth, then
    reports growth every `every` samples."""

    def __init__(self, every: int = 6) -> None:
        self.every = every
        self.calls = 0
        self.rows: list[dict[str, Any]] = []

    def step(self, actor: Any, t: float, sizes: dict[str, Any]) -> None:
        import ray

        self.calls += 1
        try:
            if self.calls == 1:
                ray.get(actor.__ray_call__.remote(start_tracing), timeout=30)
            elif self.calls % self.every == 0:
                row = ray.get(actor.__ray_call__.remote(growth), timeout=120)
                self.rows.append({"t": t, **row, "sizes": sizes})
        except Exception as err:  # the actor restarted (a fault): trace its new life from scratch
            self.rows.append({"t": t, "error": f"{type(err).__name__}: {err}"[:200]})
            self.calls = 0
