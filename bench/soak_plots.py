"""The soak's figures (bench/soak.py): the whole run in one tall figure for bench/results, and two
small ones for docs/RELIABILITY.md (RSS per process; the failed share of each fault window)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    fig, (ax_rss, ax_size, ax_req) = plt.subplots(3, 1, figsize=(11, 11), sharex=True)
    series: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        for key, mem in s["processes"].items():
            if key.startswith(("ray::IDLE", "ray::CoreWorker")):
                continue
            series.setdefault(key, []).append((s["t"] / 60, mem["rss_mb"]))
    for key, pts in sorted(series.items()):
        if len(pts) > 1:
            ax_rss.plot(*zip(*pts, strict=True), label=key, linewidth=1)
    ax_rss.set_ylabel("RSS (MiB)")
    ax_rss.legend(fontsize=6, ncol=3, loc="upper left")
    sizes: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        for key, n in s["sizes"].items():
            sizes.setdefault(key, []).append((s["t"] / 60, n))
    for key, pts in sorted(sizes.items()):
        ax_size.plot(*zip(*pts, strict=True), label=key, linewidth=1)
    ax_size.set_yscale("symlog")
    ax_size.set_ylabel("entries")
    ax_size.legend(fontsize=7, loc="upper left")
    ts = [s["t"] / 60 for s in samples]
    sent = [s["sent"] for s in samples]
    failed = [s["failed"] for s in samples]
    ax_req.plot(ts, sent, label="requests sent")
    ax_req.plot(ts, failed, label="failed", color="red")
    ax_req.set_ylabel("cumulative requests")
    ax_req.set_yscale("symlog")
    ax_req.legend(fontsize=7, loc="upper left")
    ax_req.set_xlabel("minutes")
    for f in report["faults"]:
        for ax in (ax_rss, ax_size, ax_req):
            ax.axvline(f["t"] / 60, color="grey", linestyle=":", linewidth=0.8)
        ax_req.annotate(f["kind"], (f["t"] / 60, 1), rotation=90, fontsize=6, va="bottom")
    fig.suptitle(
        f"soak: {report['rate_rps']} req/s ({report['config']['load']:.0%} of capacity) for "
        f"{report['seconds'] / 60:.0f} min, {report['sent']} sent, {report['failed']} failed"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def role_of(key: str) -> str:
    """A sampled process's part, from its key "<title>[<pid>]": a Ray worker's title carries the
    method it runs at that moment (ray::ServeReplica:epp:Gateway.check_health), dropped here."""
    title = key.split("[")[0]
    return title.split(".", 1)[0] if title.startswith("ray::") else title


def plot_small(report: dict[str, Any], rss_path: Path, errors_path: Path) -> None:
    """Two small figures for the docs: RSS per process over time (one colour per role, every
    incarnation a line), and the failed share of each fault window next to the fault-free one,
    above the failures a minute."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[float, float]]] = {}
    for s in report["samples"]:
        for key, mem in s["processes"].items():
            if not key.startswith(("ray::IDLE", "ray::CoreWorker")):
                series.setdefault(key, []).append((s["t"] / 60, mem["rss_mb"]))
    roles = sorted({role_of(key) for key in series})
    colours = {role: plt.get_cmap("tab20")(i % 20) for i, role in enumerate(roles)}
    fig, ax = plt.subplots(figsize=(8, 4.6))
    labelled: set[str] = set()
    for key, pts in sorted(series.items()):
        role = role_of(key)
        if len(pts) > 1:
            ax.plot(*zip(*pts, strict=True), color=colours[role], linewidth=0.9,
                    label=None if role in labelled else role)  # fmt: skip
            labelled.add(role)
    for f in report["faults"]:
        ax.axvline(f["t"] / 60, color="grey", linestyle=":", linewidth=0.6)
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title(f"RSS of every process, {report['seconds'] / 60:.0f} min soak (dotted: faults)", fontsize=9)
    ax.legend(fontsize=6, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(rss_path, dpi=80)
    plt.close(fig)

    fig, (ax_bar, ax_min) = plt.subplots(2, 1, figsize=(8, 5.2))
    windows = report["faults"]
    labels = [f"{w['kind']} {w['t'] / 60:.0f}'" for w in windows] + ["fault-free"]
    free = report["fault_free"]
    shares = [100 * w["failed"] / w["requests"] if w["requests"] else 0.0 for w in windows]
    shares.append(100 * free["failed"] / free["sent"] if free["sent"] else 0.0)
    ax_bar.bar(range(len(labels)), shares, color=["tab:red"] * len(windows) + ["tab:green"])
    ax_bar.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=6)
    ax_bar.set_ylabel("failed %", fontsize=8)
    ax_bar.set_title("failed share of the requests ending in each fault's window", fontsize=9)
    # failures a minute, from the samples' running count (the report keeps 2,000 failures at most)
    samples = report["samples"]
    minutes = int(report["seconds"] // 60) + 1
    failed = [0] * minutes
    for before, after in itertools.pairwise(samples):
        failed[min(minutes - 1, int(after["t"] // 60))] += after["failed"] - before["failed"]
    ax_min.bar(range(minutes), failed, width=0.9, color="tab:red")
    for w in windows:
        ax_min.axvline(w["t"] / 60, color="grey", linestyle=":", linewidth=0.6)
    ax_min.set_xlabel("minute (by completion; dotted: faults)", fontsize=8)
    ax_min.set_ylabel("failed requests", fontsize=8)
    fig.tight_layout()
    fig.savefig(errors_path, dpi=80)
    plt.close(fig)


def plot_profile_actors(report: dict[str, Any], path: Path) -> None:
    """The profile actors' RSS (every incarnation a line) over the entries of their growing
    structures (each profile actor's prefix indexes, standbys included): whether an actor's memory
    follows structures that are capped, or grows beside them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rss: dict[str, list[tuple[float, float]]] = {}
    sizes: dict[str, list[tuple[float, float]]] = {}
    for s in report["samples"]:
        for key, mem in s["processes"].items():
            if key.startswith("ray::ProfileActor"):
                rss.setdefault(key, []).append((s["t"] / 60, mem["rss_mb"]))
        for key, n in s["sizes"].items():
            if key.endswith((".index", ".blocks")) and "/" in key:
                sizes.setdefault(key, []).append((s["t"] / 60, n / 1000))
    fig, (ax_rss, ax_size) = plt.subplots(2, 1, figsize=(8, 5.6), sharex=True)
    for key, pts in sorted(rss.items()):
        if len(pts) > 1:
            ax_rss.plot(*zip(*pts, strict=True), linewidth=1, label=key)
    for key, pts in sorted(sizes.items()):
        ax_size.plot(*zip(*pts, strict=True), linewidth=1, label=key)
    for f in report["faults"]:
        for ax in (ax_rss, ax_size):
            ax.axvline(f["t"] / 60, color="grey", linestyle=":", linewidth=0.5)
    ax_rss.set_ylabel("RSS (MiB)")
    ax_rss.set_title("profile actors: RSS, and the entries of their indexes (dotted: faults)", fontsize=9)
    ax_rss.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax_size.set_ylabel("entries (thousands)")
    ax_size.set_xlabel("minutes")
    ax_size.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
