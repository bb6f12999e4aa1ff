"""The scale-out benchmarks (bench/profile_actor_rate.py, bench/snapshot_fanout.py,
bench/scale_out.py) at a tiny size, so they keep working and report what docs/BENCHMARKS.md quotes.
bench/scale_out.py's `epp up` per configuration is not started here (a Ray of its own per row);
its measurement runs against a fake worker."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import psutil
import pytest

from bench import profile_actor_rate, scale_out, snapshot_fanout


def test_scale_out_measures_throughput_and_cpu_by_role():
    from aiohttp import web

    from bench.fake_worker import make_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loop = asyncio.new_event_loop()
    started = threading.Event()

    def serve():
        asyncio.set_event_loop(loop)
        runner = web.AppRunner(make_app(port, 1, 0.0))
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        me = psutil.Process()
        row = scale_out.measure(f"http://127.0.0.1:{port}", me, me, 4, 0.5)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    assert row["rps"] > 0 and row["errors"] == 0
    assert row["cores"]["load generator"] > 0  # this process: the roles are told apart
    assert set(row["cores"]) <= {r for r, _ in scale_out.ROLES} | {"ray other", "fake workers", "load generator"}
    assert len({json.loads(b)["prompt"][:64] for b in scale_out.bodies(256)}) == 256  # 256 shard keys


@pytest.mark.ray
def test_profile_actor_rate_tiny(ray_session, tmp_path, capsys):
    out = tmp_path / "rate.json"
    rows = profile_actor_rate.main(["--pods", "4,16", "--seconds", "0.5", "--warmup", "0.3", "--concurrency", "4",
                                    "--json", str(out)])  # fmt: skip
    assert [r["pods"] for r in rows] == [4, 16]
    for r in rows:
        assert r["decisions"] > 0 and r["actor_cores"] > 0 and r["actor_cpu_ms_per_decision"] > 0
    assert "| 16 |" in capsys.readouterr().out
    assert json.loads(out.read_text())["results"][0]["pods"] == 4


@pytest.mark.ray
def test_snapshot_fanout_tiny(ray_session, capsys):
    rows = snapshot_fanout.main(["--pods", "4,32", "--watchers", "0,2", "--rate", "20", "--seconds", "0.5"])
    assert [(r["pods"], r["watchers"], r["mode"]) for r in rows] == [
        (p, w, m) for p in (4, 32) for w, m in ((0, "full"), (2, "full"), (2, "delta"))
    ]
    for r in rows:
        assert r["published_per_s"] > 0 and r["datastore_cores"] > 0
        assert (r["received_per_s"] > 0) == (r["watchers"] > 0)
    assert rows[3]["snapshot_bytes"] > rows[0]["snapshot_bytes"]  # a full snapshot grows with the pool
    assert "| 32 | 2 | delta |" in capsys.readouterr().out
