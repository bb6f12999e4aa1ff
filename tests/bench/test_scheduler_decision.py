"""The decision benchmark runs end to end at a tiny size and reports what docs/BENCHMARKS.md quotes."""

import json

from bench import scheduler_decision


def test_tiny_run_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "decision.json"
    args = ["--endpoints", "4,16", "--decisions", "40", "--warmup", "20", "--rounds", "2", "--groups", "4"]
    scheduler_decision.main([*args, "--json", str(out)])
    printed = capsys.readouterr().out
    assert "| 4 |" in printed and "| 16 |" in printed
    rows = json.loads(out.read_text())["results"]
    assert [r["endpoints"] for r in rows] == [4, 16]
    for r in rows:
        assert 0 < r["decision_p50_us"] <= r["decision_p99_us"]
        assert r["without_prefix_p50_us"] > 0
        assert r["index_servers"] > 0 and r["index_blocks"] > 0
        assert "Scorer:prefix-cache-scorer" in r["plugin_p50_us"]
        assert len(r["rounds_total_p50_us"]) == 2
        assert r["prefix_hit_pct"] > 50  # 4 prefix groups: most requests repeat one
