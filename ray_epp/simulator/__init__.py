"""A vLLM-compatible model-server simulator: one engine model driven two ways.

Real time behind vLLM's OpenAI HTTP surface (`SimPod`, `SimCluster`, `start_sim_pods_in_thread`) and
virtual time in a discrete-event cluster simulation (`ClusterSim`, `run_cluster_sim`). Imports only
the standard library, aiohttp, prometheus-client, pydantic, pyyaml and kvevents (vLLM's KV events,
which pods publish when `kv_events` is set).
"""

from ray_epp.simulator.baselines import BASELINES, LeastQueue, PowerOfTwo, RandomRouter, RoundRobin
from ray_epp.simulator.cli import add_sim_arguments, main, run_sim
from ray_epp.simulator.cluster_sim import ClusterSim, run_cluster_sim
from ray_epp.simulator.config import (
    DEFAULT_MODEL,
    ROLE_LABEL,
    FailureConfig,
    PodConfig,
    TimingConfig,
    load_pod_configs,
    make_pod_configs,
)
from ray_epp.simulator.engine import Engine, EngineRequest
from ray_epp.simulator.http_server import POD_HEADER, SimCluster, SimPod
from ray_epp.simulator.report import Dist, PodStats, RequestResult, SimReport
from ray_epp.simulator.routing import HOLD, PodView, RouteDecision, Router, SimRequest
from ray_epp.simulator.threaded import PodHandle, ThreadedSimCluster, start_sim_pods_in_thread
from ray_epp.simulator.tokens import CHARS_PER_TOKEN, block_hashes, count_tokens, flatten_messages
from ray_epp.simulator.workload import WorkloadSpec, generate_workload

__all__ = [
    "BASELINES",
    "CHARS_PER_TOKEN",
    "DEFAULT_MODEL",
    "HOLD",
    "POD_HEADER",
    "ROLE_LABEL",
    "ClusterSim",
    "Dist",
    "Engine",
    "EngineRequest",
    "FailureConfig",
    "LeastQueue",
    "PodConfig",
    "PodHandle",
    "PodStats",
    "PodView",
    "PowerOfTwo",
    "RandomRouter",
    "RequestResult",
    "RoundRobin",
    "RouteDecision",
    "Router",
    "SimCluster",
    "SimPod",
    "SimReport",
    "SimRequest",
    "ThreadedSimCluster",
    "TimingConfig",
    "WorkloadSpec",
    "add_sim_arguments",
    "block_hashes",
    "count_tokens",
    "flatten_messages",
    "generate_workload",
    "load_pod_configs",
    "main",
    "make_pod_configs",
    "run_cluster_sim",
    "run_sim",
    "start_sim_pods_in_thread",
]
