"""bench.parallel_profiles at tiny sizes, on the test session's Ray, so it cannot rot: every row is
there, the actor sides decide alike, and one round runs prefill beside decode only for long prompts."""

from __future__ import annotations

import json

from bench.parallel_profiles import ACTORS, IN_PROCESS, ONE_ROUND, PROMPTS, SEQUENTIAL, main


def test_quick_run_measures_every_row(ray_session, tmp_path, capsys):
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "parallel_profiles_quick.json").read_text())
    assert "| 8 | long |" in capsys.readouterr().out

    rows = {r["prompt"]: r for r in result["pd"]}
    assert set(rows) == set(PROMPTS)
    for row in rows.values():
        assert row["disagreements"] == 0 and row["errors"] == 0
        assert row[SEQUENTIAL]["decisions"] == row[ONE_ROUND]["decisions"]
        assert all(row[side]["p50_ms"] > 0 for side in (SEQUENTIAL, ONE_ROUND, IN_PROCESS))
    # short prompts: the decider says no before decode runs, so neither mode runs prefill
    assert rows["short"]["actor_calls"][ONE_ROUND]["prefill"] == 0
    assert rows["short"][SEQUENTIAL]["decisions"] == {"decode-only": 6}
    # long prompts: always disaggregated, prefill runs as often either way, decode-prefill in one round
    assert rows["long"][SEQUENTIAL]["decisions"] == {"prefill-decode": 6}
    long_calls = rows["long"]["actor_calls"]
    assert long_calls[ONE_ROUND]["prefill"] == long_calls[SEQUENTIAL]["prefill"] > 0

    counts = [r["profiles"] for r in result["all_profiles"]]
    assert counts == [1, 2]
    assert all(r[IN_PROCESS]["p50_ms"] > 0 and r[ACTORS]["p50_ms"] > 0 for r in result["all_profiles"])
