"""Sweeps, reports (JSON + Markdown + PNG), target verdicts and the command line."""

from __future__ import annotations

import json
import math

import pytest

from bench import cli, targets
from bench.report import markdown, write_report
from bench.runner import RateSpec, calibrate, run_sweep
from bench.scenarios import SCENARIOS, Scenario
from bench.workloads import random_prompt_workload, uniform_spec
from ray_epp.simulator import make_pod_configs
from serve_app.cli.commands import main as epp_main


def tiny_scenario(**kw) -> Scenario:
    base = dict(
        name="tiny",
        title="Tiny",
        description="a test scenario",
        pods=lambda: make_pod_configs(2),
        workload=lambda rate, seed, n: random_prompt_workload(uniform_spec(n), rate, seed),
        fractions=(0.5, 1.0),
        policies=("epp-default", "round-robin"),
        duration_s=2.0,
        min_requests=20,
        target="uniform",
    )
    base.update(kw)
    return Scenario(**base)


def test_rate_specs():
    assert RateSpec.parse("0.9x").resolve(200) == (0.9, 180)
    assert RateSpec.parse("50").resolve(200) == (0.25, 50)
    for bad in ("fast", "-1", "0x"):
        with pytest.raises(ValueError):
            RateSpec.parse(bad)


def test_calibration_measures_a_capacity():
    cap = calibrate(tiny_scenario(), seed=0)
    assert cap["request_rate"] > 0 and cap["burst_estimate"] > 0
    assert len(cap["probes"]) >= 4
    assert cap["request_rate"] == max(p["throughput"] for p in cap["probes"])


def test_a_sweep_writes_json_markdown_and_png(tmp_path):
    result = run_sweep(tiny_scenario(), capacity=20.0, progress=False, command="epp bench tiny")
    assert [(r["policy"], r["rate"]) for r in result["runs"]] == [
        ("epp-default", 10.0), ("round-robin", 10.0), ("epp-default", 20.0), ("round-robin", 20.0)
    ]  # fmt: skip
    assert all(r["metrics"]["completed"] == r["metrics"]["requests"] == 40 for r in result["runs"][2:])
    result["verdicts"] = targets.check(result)
    paths = write_report(result, tmp_path)
    data = json.loads(paths["json"].read_text())
    assert data["scenario"] == "tiny" and len(data["runs"]) == 4
    assert data["runs"][0]["metrics"]["ttft_ms"]["p90"] > 0
    md = paths["markdown"].read_text()
    assert "| rate (req/s) |" in md and "**epp-default**" in md and "round-robin" in md
    assert "epp bench tiny" in md and "![Tiny](tiny.png)" in md and "Targets:" in md
    png = paths["png"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def test_the_plot_legend_lies_outside_both_panels():
    from bench.report import plot_figure

    runs = [
        {"policy": p, "rate": rate, "metrics": {"ttft_ms": {"p90": 10.0 * rate + k}, "output_throughput": 100.0 * rate}}
        for k, p in enumerate(("epp-default", "round-robin", "least-queue"))
        for rate in (1.0, 2.0, 3.0)
    ]
    result = {"title": "T", "pods": 2, "driver": "cluster-sim", "capacity": {"request_rate": 2.0}, "runs": runs}
    fig = plot_figure(result)
    fig.canvas.draw()
    assert all(ax.get_legend() is None for ax in fig.axes)  # no legend inside a panel
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["epp-default", "round-robin", "least-queue"]
    box = legend.get_window_extent()
    assert all(not box.overlaps(ax.get_window_extent()) for ax in fig.axes)


def test_markdown_has_a_priority_table_when_priorities_are_mixed():
    result = fake_result({"epp-default": {}, "round-robin": {}})
    result["runs"][0]["metrics"]["by_priority"] = {
        "1": {"requests": 5, "completed": 5, "shed": 0, "errors": 0, "ttft_ms": ms(10), "e2e_ms": ms(20)},
        "-1": {"requests": 5, "completed": 2, "shed": 3, "errors": 0, "ttft_ms": ms(10), "e2e_ms": ms(20)},
    }
    assert "By priority" in markdown(result)


def ms(p90: float) -> dict[str, float]:
    return {"p50": p90 / 2, "p90": p90, "p99": p90 * 2, "mean": p90 / 2}


def metrics(ttft90=100.0, tput=1000.0, loads=0, **kw) -> dict:
    m = {
        "requests": 10, "completed": 10, "shed": 0, "errors": 0, "ttft_ms": ms(ttft90), "itl_ms": ms(10),
        "e2e_ms": ms(1000), "output_throughput": tput, "prefix_hit_rate": 0.5, "lora_loads": loads,
        "route_us": {"mean": 10.0},
    }  # fmt: skip
    m.update(kw)
    return m


def fake_result(by_policy: dict[str, dict], target: str = "", fractions=(0.9,)) -> dict:
    runs = [
        {"policy": p, "fraction": f, "rate": 100 * f, "metrics": metrics(**kw)}
        for f in fractions
        for p, kw in by_policy.items()
    ]
    return {
        "scenario": "x", "title": "X", "description": "d", "driver": "cluster-sim", "seed": 0, "pods": 2,
        "capacity": {"request_rate": 100.0, "method": "m"}, "near_saturation": 0.9, "target": target,
        "runs": runs, "meta": {"command": "c"}, "duration_s": 1,
    }  # fmt: skip


def passed(verdicts) -> list:
    return [v["passed"] for v in verdicts]


def test_shared_prefix_targets():
    good = fake_result(
        {
            "epp-default": dict(ttft90=20, tput=1000),
            "round-robin": dict(ttft90=100),
            "sglang-cache-aware": dict(ttft90=30),
        },
        "shared-prefix",
    )
    assert passed(targets.check(good)) == [True, True, True]
    bad = fake_result(
        {
            "epp-default": dict(ttft90=30, tput=900),
            "round-robin": dict(ttft90=100),
            "sglang-cache-aware": dict(ttft90=30),
        },
        "shared-prefix",
    )
    assert passed(targets.check(bad)) == [False, False, False]
    assert "0.30x" in targets.check(bad)[0]["detail"]


def test_multi_lora_targets_need_every_rung():
    result = fake_result(
        {"epp-lora": dict(ttft90=50, loads=10), "power-of-two": dict(ttft90=60, loads=12)},
        "multi-lora",
        fractions=(0.5, 0.9),
    )
    assert passed(targets.check(result)) == [True, True]
    result["runs"][3]["metrics"]["lora_loads"] = 10  # a tie at 0.9x is not "fewer"
    v = targets.check(result)
    assert passed(v) == [False, True] and "missed at 0.9x" in v[0]["detail"]


def test_overload_targets():
    def prio(crit_ttft, crit_shed, shed_shed):
        return {
            "1": {
                "requests": 10,
                "completed": 10 - crit_shed,
                "shed": crit_shed,
                "errors": 0,
                "ttft_ms": ms(crit_ttft),
            },
            "-1": {"requests": 10, "completed": 10 - shed_shed, "shed": shed_shed, "errors": 0, "ttft_ms": ms(5)},
        }

    result = fake_result({"epp-default": {}}, "overload", fractions=(0.5, 1.5))
    result["runs"][0]["metrics"]["by_priority"] = prio(100, 0, 0)
    result["runs"][1]["metrics"]["by_priority"] = prio(150, 0, 6)
    assert passed(targets.check(result)) == [True, True]
    result["runs"][1]["metrics"]["by_priority"] = prio(250, 1, 6)
    assert passed(targets.check(result)) == [False, False]
    # ray_epp/configs/priority.yaml is held to the same target when the run has it
    both = fake_result({"epp-default": {}, "epp-priority": {}}, "overload", fractions=(0.5, 1.5))
    both["policies"] = ["epp-default", "epp-priority"]
    for run, (ttft, crit_shed) in zip(both["runs"], [(100, 0), (100, 0), (250, 0), (150, 0)], strict=True):
        run["metrics"]["by_priority"] = prio(ttft, crit_shed, 6)
    verdicts = targets.check(both)
    assert [(v["policy"], v["passed"]) for v in verdicts] == [
        ("epp-default", True), ("epp-default", False), ("epp-priority", True), ("epp-priority", True),
    ]  # fmt: skip


def test_uniform_targets_allow_five_percent():
    ok = fake_result({"epp-default": dict(ttft90=104, tput=960), "random": dict(ttft90=100, tput=1000)}, "uniform")
    assert all(passed(targets.check(ok)))
    bad = fake_result({"epp-default": dict(ttft90=110, tput=1000), "random": dict(ttft90=100, tput=1000)}, "uniform")
    verdicts = {v["target"]: v["passed"] for v in targets.check(bad)}
    assert verdicts["TTFT p90 within 5% of the best peer"] is False
    assert verdicts["output throughput within 5% of the best peer"] is True


def test_missing_policies_are_not_verdicts():
    v = targets.check(fake_result({"round-robin": {}}, "shared-prefix"))
    assert passed(v) == [None]


def test_cli_lists_scenarios_and_rejects_unknown_ones(capsys):
    assert epp_main(["bench", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in SCENARIOS) and "sglang-cache-aware" in out
    assert cli.main(["no-such-scenario"]) == 2
    assert cli.main(["uniform", "--policies", "nope"]) == 2
    assert cli.main(["uniform", "--rates", "fast"]) == 2


def test_cli_runs_a_scenario_and_writes_the_report(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(SCENARIOS, "tiny", tiny_scenario())
    code = cli.main(["tiny", "--policies", "round-robin,epp-default", "--rates", "5", "--capacity", "10",
                     "--out", str(tmp_path), "--no-progress"])  # fmt: skip
    assert code == 0
    assert {p.name for p in tmp_path.iterdir()} == {"tiny.json", "tiny.md", "tiny.png"}
    data = json.loads((tmp_path / "tiny.json").read_text())
    assert data["meta"]["command"] == "epp bench tiny --policies round-robin,epp-default --rates 5 --capacity 10.0"
    assert not math.isnan(data["runs"][0]["metrics"]["ttft_ms"]["p50"])


def test_figures_without_samples_are_null_in_the_json(tmp_path):
    result = fake_result({"epp-default": {}}, "")
    result["runs"][0]["metrics"]["ttft_ms"]["p90"] = math.nan
    paths = write_report(result, tmp_path)
    text = paths["json"].read_text()
    assert "NaN" not in text
    assert json.loads(text)["runs"][0]["metrics"]["ttft_ms"]["p90"] is None
    assert "| - |" in paths["markdown"].read_text()
