"""A sweep's report: JSON (everything), Markdown (the table and the target verdicts) and a PNG
(TTFT p90 and output throughput against request rate, one line per policy)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bench.policies import is_ours

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def write_report(result: dict[str, Any], out_dir: str | Path = RESULTS_DIR) -> dict[str, Path]:
    """Writes <scenario>.json, .md and .png into out_dir; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / result["scenario"]
    paths = {"json": stem.with_suffix(".json"), "markdown": stem.with_suffix(".md"), "png": stem.with_suffix(".png")}
    paths["json"].write_text(json.dumps(without_nan(result), indent=1, allow_nan=False) + "\n")
    write_plot(result, paths["png"])
    paths["markdown"].write_text(markdown(result, png_name=paths["png"].name))
    return paths


def without_nan(value: Any) -> Any:
    """NaN (a figure with no samples, e.g. the TTFT of a class that was all shed) as null: strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: without_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_nan(v) for v in value]
    return value


def _num(x: float, fmt: str = "{:,.0f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def table(result: dict[str, Any]) -> str:
    lines = [
        "| rate (req/s) | x cap | policy | TTFT p50 | TTFT p90 | TTFT p99 | ITL p50 | E2E p50 | E2E p90 | E2E p99 "
        "| out tok/s | prefix hit | LoRA loads | errors | shed | decision µs |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in result["runs"]:
        m = run["metrics"]
        name = f"**{run['policy']}**" if is_ours(run["policy"]) else run["policy"]
        t, i, e = m["ttft_ms"], m["itl_ms"], m["e2e_ms"]
        lines.append(
            f"| {run['rate']:.1f} | {run['fraction']:.2f} | {name} | {_num(t['p50'])} | {_num(t['p90'])} "
            f"| {_num(t['p99'])} | {_num(i['p50'], '{:.1f}')} | {_num(e['p50'])} | {_num(e['p90'])} | {_num(e['p99'])} "
            f"| {_num(m['output_throughput'])} | {m['prefix_hit_rate']:.2f} | {m.get('lora_loads', 0)} "
            f"| {m['errors']} | {m['shed']} | {_num(m.get('route_us', {}).get('mean', math.nan))} |"
        )
    return "\n".join(lines)


def priority_table(result: dict[str, Any]) -> str:
    rows = [r for r in result["runs"] if "by_priority" in r["metrics"]]
    if not rows:
        return ""
    lines = [
        "| rate (req/s) | x cap | policy | priority | requests | completed | shed | errors | TTFT p50 | TTFT p90 "
        "| TTFT p99 | E2E p90 |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in rows:
        for prio, c in run["metrics"]["by_priority"].items():
            t = c["ttft_ms"]
            lines.append(
                f"| {run['rate']:.1f} | {run['fraction']:.2f} | {run['policy']} | {prio} | {c['requests']} "
                f"| {c['completed']} | {c['shed']} | {c['errors']} | {_num(t['p50'])} | {_num(t['p90'])} "
                f"| {_num(t['p99'])} | {_num(c['e2e_ms']['p90'])} |"
            )
    return "\n".join(lines)


def verdict_lines(result: dict[str, Any]) -> str:
    out = []
    for v in result.get("verdicts", []):
        mark = {True: "**met**", False: "**missed**", None: "—"}[v["passed"]]
        out.append(f"* {mark} {v['target']} ({v['policy']}): {v['detail']}")
    return "\n".join(out)


def markdown(result: dict[str, Any], png_name: str | None = None) -> str:
    cap = result["capacity"]
    parts = [
        f"# {result['title']}",
        "",
        result["description"],
        "",
        f"* driver: {result['driver']}, seed {result['seed']}, {result['pods']} pods, "
        f"each rate run for {result.get('duration_s', 0):g} s of arrivals",
        f"* capacity: **{cap['request_rate']:.1f} req/s** ({cap['method']})",
        f"* command: `{result['meta'].get('command', '')}`",
        f"* run {result['meta'].get('date', '')} at commit {result['meta'].get('git_commit', '') or '?'}",
        "",
        (
            "Latencies in ms; decision µs is the router's wall time per request in this process."
            if result["driver"] != "e2e"
            else f"Latencies in ms. End to end: the scenario's first {result['pods']} pods (its description "
            "names the simulation's pool); the routers are other processes, so decision µs is not measured (-)."
        ),
        "",
        table(result),
    ]
    pt = priority_table(result)
    if pt:
        parts += ["", "By priority (1 critical, -1 sheddable):", "", pt]
    vl = verdict_lines(result)
    if vl:
        parts += ["", "Targets:", "", vl]
    if png_name:
        parts += ["", f"![{result['title']}]({png_name})"]
    return "\n".join(parts) + "\n"


def write_plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = plot_figure(result)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # "tight" keeps the legend below the panels
    plt.close(fig)


def plot_figure(result: dict[str, Any]) -> Any:
    """TTFT p90 and output throughput against the request rate, one line per policy. The legend
    sits below both panels, outside the axes, so it never hides a data point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_x) = plt.subplots(1, 2, figsize=(13, 5))
    policies = list(dict.fromkeys(r["policy"] for r in result["runs"]))
    markers = "os^vD<>ph*x+"
    for k, policy in enumerate(policies):
        runs = sorted((r for r in result["runs"] if r["policy"] == policy), key=lambda r: r["rate"])
        rates = [r["rate"] for r in runs]
        style = {"linewidth": 2.6 if is_ours(policy) else 1.3, "marker": markers[k % len(markers)], "label": policy}
        if not is_ours(policy):
            style["linestyle"] = "--"
        ax_t.plot(rates, [r["metrics"]["ttft_ms"]["p90"] for r in runs], **style)
        ax_x.plot(rates, [r["metrics"]["output_throughput"] for r in runs], **style)
    cap = result["capacity"]["request_rate"]
    for ax in (ax_t, ax_x):
        ax.axvline(cap, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xlabel("request rate (req/s); dotted line: calibrated capacity")
        ax.grid(True, alpha=0.3)
    ttfts = [r["metrics"]["ttft_ms"]["p90"] for r in result["runs"]]
    if any(isinstance(t, float) and t > 0 for t in ttfts):  # NaN (nothing completed) compares False
        ax_t.set_yscale("log")
    ax_t.set_ylabel("TTFT p90 (ms, log scale)")
    ax_t.set_title("Time to first token, p90 (lower is better)")
    ax_x.set_ylabel("output tokens/s")
    ax_x.set_title("Output throughput (higher is better)")
    fig.suptitle(f"{result['title']} — {result['pods']} pods, {result['driver']}")
    fig.tight_layout()
    handles, labels = ax_x.get_legend_handles_labels()
    rows = math.ceil(len(labels) / 6)  # at most 6 to a row, the rows evenly filled
    ncol = max(1, math.ceil(len(labels) / max(rows, 1)))
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, fontsize=8, frameon=False)
    return fig
