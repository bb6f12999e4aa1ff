"""ray_epp/configs/lora.yaml: the adapter's location first (as reported or as remembered), load among the
servers holding it, a popular adapter spreads to free slots, saturation spills (utilization-detector
filter + lora-residency / prefill-backlog / queue / kv-cache scorers)."""

import time
from pathlib import Path

import pytest

from scheduler import Scheduler, load_config_file
from tests.scheduler.helpers import endpoint, request

CONFIG = Path(__file__).resolve().parents[4] / "ray_epp" / "configs" / "lora.yaml"


def pod(name, q, kv, active=(), max_active=2, **extra):
    return endpoint(
        name,
        waiting_queue_size=q,
        kv_cache_usage_percent=kv,
        active_models=list(active),
        max_active_models=max_active,
        **extra,
    )


@pytest.mark.parametrize(
    ("pods", "want"),
    [
        pytest.param(
            [pod("has-it", 4, 0.7, ["lora-1"]), pod("free-slot", 0, 0.0, ["x"])],
            "has-it",
            id="a loaded adapter beats an idle server with a free slot",
        ),
        pytest.param(
            [pod("has-it", 5, 0.3, ["lora-1"]), pod("free-slot", 2, 0.3, ["x"])],
            "free-slot",
            id="its server saturated (queue 5): spill to a free slot",
        ),
        pytest.param(
            [pod("has-it", 0, 0.85, ["lora-1"]), pod("free-slot", 4, 0.5, ["x"])],
            "free-slot",
            id="its server saturated (KV 0.85): spill to a free slot",
        ),
        pytest.param(
            [pod("a", 3, 0.5, ["lora-1"]), pod("b", 1, 0.5, ["lora-1"]), pod("c", 0, 0.1, ["x"])],
            "b",
            id="among servers holding it, the least loaded",
        ),
        pytest.param(
            [pod("full", 0, 0.0, ["x", "y"]), pod("free-slot", 3, 0.6, ["x"])],
            "free-slot",
            id="adapter nowhere: a free slot beats an idle full server",
        ),
        pytest.param(
            [pod("has-it", 9, 0.9, ["lora-1"]), pod("free-slot", 7, 0.95, ["x"])],
            "has-it",
            id="everything saturated: fail open, affinity decides",
        ),
        pytest.param(
            [pod("stale", 0, 0.0, ["lora-1"], update_time=1.0), pod("fresh", 1, 0.2, ["x"], update_time=1.0)],
            "fresh",
            id="stale metrics: the endpoint is avoided",
        ),
    ],
)
def test_lora_config(pods, want):
    for p in pods:  # the pod named "fresh" was scraped just now
        if p.name == "fresh":
            p.metrics.update_time = time.time()
    sched = Scheduler.from_config(load_config_file(CONFIG))
    assert sched.schedule(request(model="lora-1"), pods).target.name == want


def test_an_idle_adapter_keeps_its_server():
    """vLLM stops listing an adapter once its requests finish; the scheduler remembers it is there."""
    sched = Scheduler.from_config(load_config_file(CONFIG))
    first = [pod("a", 0, 0.1, ["lora-1"], max_active=4), pod("b", 0, 0.1, ["m2"], max_active=4)]
    assert sched.schedule(request(model="lora-1", request_id="l1"), first).target.name == "a"
    sched.response_complete(request(model="lora-1", request_id="l1"), "a")
    for i in range(9):  # other traffic: lora-1 is a tenth of it, one server is enough for it
        req = request(model="m2", request_id=f"m{i}")
        sched.response_complete(req, sched.schedule(req, first).target.name)
    idle = [pod("a", 1, 0.1, ["m2"], max_active=4), pod("b", 0, 0.0, ["m2"], max_active=4)]
    assert sched.schedule(request(model="lora-1", request_id="l2"), idle).target.name == "a"


def test_a_hot_adapter_whose_server_is_busiest_takes_a_free_slot():
    sched = Scheduler.from_config(load_config_file(CONFIG))
    pods = [pod("a", 0, 0.1, ["lora-1"], max_active=4), pod("b", 0, 0.1, max_active=4)]
    assert sched.schedule(request(model="lora-1", request_id="1"), pods).target.name == "a"
    # All the traffic is lora-1's, its first request is still prefilling on "a", and "a" queues.
    busy = [pod("a", 2, 0.1, ["lora-1"], max_active=4), pod("b", 0, 0.1, max_active=4)]
    assert sched.schedule(request(model="lora-1", request_id="2"), busy).target.name == "b"
