"""Routing policies for the benchmarks, by name: ours (any EndpointPickerConfig) and the peers.

* `epp-<name>`: our Scheduler with ray_epp/configs/<name>.yaml (`epp-default`, `epp-gie-default`,
  `epp-legacy-filter-tree`, `epp-lora`, `epp-pd`), or with an experiment from
  bench/configs/<name>.yaml (`epp-strict-admission`), or `epp:<path to a config>`; with the
  gateway's admission.
* `round-robin`, `random`, `least-queue`: the simulator's baselines (ray_epp/simulator/baselines.py).
* `power-of-two`: Ray Serve's default router (with its multiplexed-model preference for LoRA).
* `ray-prefix-affinity`: ray.llm's PrefixCacheAffinityRouter, defaults.
* `sglang-cache-aware`: sglang-router's (and vllm-router's) cache_aware, defaults.
* `dynamo-kv`: NVIDIA Dynamo's KV router, its own selection core (ai-dynamo-runtime), defaults,
  fed the pods' KV events (bench/policies/dynamo.py).

Every policy is a fresh object per run, seeded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.policies.dynamo import DynamoKvRouter
from bench.policies.epp import SchedulerRouter, prefill_target
from bench.policies.ray_serve import RayPowerOfTwo, RayPrefixCacheAffinity
from bench.policies.sglang import SGLangCacheAware
from bench.policies.text_tree import TextPrefixTree
from ray_epp.simulator import LeastQueue, RandomRouter, RoundRobin

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "ray_epp" / "configs"  # the shipped configs
EXPERIMENTS = ROOT / "bench" / "configs"  # benchmark-only variants, each says why it exists
OURS = "epp"

PEERS: dict[str, Callable[[int], Any]] = {
    "round-robin": lambda seed: RoundRobin(seed),
    "random": lambda seed: RandomRouter(seed),
    "least-queue": lambda seed: LeastQueue(seed),
    "power-of-two": lambda seed: RayPowerOfTwo(seed),
    "ray-prefix-affinity": lambda seed: RayPrefixCacheAffinity(seed),
    "sglang-cache-aware": lambda seed: SGLangCacheAware(seed),
    "dynamo-kv": lambda seed: DynamoKvRouter(seed),
}


def is_ours(name: str) -> bool:
    return name.startswith((OURS + "-", OURS + ":"))


def config_path(name: str) -> Path:
    """ray_epp/configs/<x>.yaml (else bench/configs/<x>.yaml) for `epp-<x>`, the path itself for `epp:<path>`."""
    if name.startswith(OURS + ":"):
        return Path(name[len(OURS) + 1 :])
    stem = name[len(OURS) + 1 :]
    shipped = CONFIGS / f"{stem}.yaml"
    return (
        shipped if shipped.is_file() or not (EXPERIMENTS / f"{stem}.yaml").is_file() else EXPERIMENTS / f"{stem}.yaml"
    )


def known_policies() -> list[str]:
    ours = sorted(f"{OURS}-{p.stem}" for p in CONFIGS.glob("*.yaml"))
    experiments = sorted(f"{OURS}-{p.stem}" for p in EXPERIMENTS.glob("*.yaml"))
    return ours + experiments + list(PEERS)


def make_policy(name: str, seed: int = 0) -> Any:
    """A fresh router for the cluster simulation; ValueError names the known policies."""
    if is_ours(name):
        path = config_path(name)
        if not path.is_file():
            raise ValueError(f"policy {name!r}: no config file {path}")
        return SchedulerRouter(path, seed=seed)
    if name not in PEERS:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(known_policies())}")
    return PEERS[name](seed)


__all__ = [
    "PEERS",
    "DynamoKvRouter",
    "RayPowerOfTwo",
    "RayPrefixCacheAffinity",
    "SGLangCacheAware",
    "SchedulerRouter",
    "TextPrefixTree",
    "config_path",
    "is_ours",
    "known_policies",
    "make_policy",
    "prefill_target",
]
