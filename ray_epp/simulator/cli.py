"""`epp sim` / `python -m ray_epp.simulator`: run simulated vLLM pods on 127.0.0.1 until interrupted.

    python -m ray_epp.simulator --pods 4 --base-port 8100 [--config pods.yaml] [--time-scale 0.1] [--seed N]

Prints one line per pod and then a JSON pod list ({"name","address","port","labels"}) that the
gateway can read (also written to --pods-json FILE when given).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from ray_epp.simulator.config import PodConfig, load_pod_configs
from ray_epp.simulator.http_server import SimCluster


def add_sim_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--pods", type=int, default=4, help="number of pods (when the config does not list them)")
    parser.add_argument("--base-port", type=int, default=8100, help="first port; pod i listens on base+i (0 = free)")
    parser.add_argument("--host", default="127.0.0.1", help="listen address")
    parser.add_argument("--config", type=Path, default=None, help="pods YAML (see docs/SIMULATOR.md)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiply every latency (0 = no sleeping)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pods-json", type=Path, default=None, help="also write the pod list here")
    parser.add_argument("--kv-events", action="store_true",
                        help="every pod publishes vLLM KV events on ZMQ (ports in the pod list's kvEvents)")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="a tokenizer.json every pod tokenizes with (default: 4 characters a token)")
    return parser


def pod_configs_from_args(args: argparse.Namespace) -> list[PodConfig]:
    if args.config is None:
        pods = [PodConfig(name=f"sim-{i}") for i in range(args.pods)]
    else:
        pods = load_pod_configs(args.config.read_text(), default_count=args.pods)
    if getattr(args, "kv_events", False):
        pods = [p.model_copy(update={"kv_events": True}) for p in pods]
    if getattr(args, "tokenizer", None) is not None:
        if not args.tokenizer.is_file():
            raise ValueError(f"--tokenizer {str(args.tokenizer)!r} is not a file")
        pods = [p.model_copy(update={"tokenizer": str(args.tokenizer)}) for p in pods]
    return pods


async def serve(args: argparse.Namespace, stop: asyncio.Event | None = None) -> None:
    """Run the pods until `stop` is set (or SIGINT/SIGTERM)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    cluster = SimCluster(
        pod_configs_from_args(args), time_scale=args.time_scale, seed=args.seed, host=args.host,
        base_port=args.base_port,
    )  # fmt: skip
    async with cluster:
        for p in cluster.pods:
            kv = p.info().get("kvEvents")
            extra = f" kv-events={kv['endpoint']} replay={kv['replay']}" if kv else ""
            print(f"{p.name} {p.url} role={p.cfg.role} model={p.cfg.model}{extra}", flush=True)
        pods = json.dumps(cluster.pods_json())
        print(pods, flush=True)
        if args.pods_json is not None:
            args.pods_json.write_text(pods + "\n")
        await stop.wait()


def run_sim(args: argparse.Namespace) -> int:
    try:
        asyncio.run(serve(args))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"epp sim: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = add_sim_arguments(argparse.ArgumentParser(prog="epp sim", description=__doc__.split("\n")[0]))
    return run_sim(parser.parse_args(argv))
