"""What the actor tests share: a config, the simulated pods' layout, fast actor options, waiting."""

from __future__ import annotations

import time

from actors import ActorOptions, PodSpec
from scheduler import LLMRequest

CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
  - pluginRef: max-score-picker
"""

BLOCKS = {"sim-0": 1000, "sim-1": 2000, "sim-2": 3000}
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def fast_options(name: str, **overrides) -> ActorOptions:
    values = {
        "datastore_name": name,
        "refresh_interval_s": 0.05,
        "scrape_timeout_s": 0.3,
        "heartbeat_s": 0.1,  # keeps update_time within utilization-detector's 200 ms
        "staleness_threshold_s": 0.8,
        "unhealthy_after_failures": 3,
        "check_interval_s": 0.05,
        "snapshot_min_interval_s": 0.0,
        "watch_timeout_s": 1.0,
        "models_refresh_s": 1.0,
        "plugin_modules": ["tests.actors.plugins_for_tests"],
    }
    values.update(overrides)
    return ActorOptions(**values)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    from ray.exceptions import ActorUnavailableError

    while time.monotonic() < deadline:
        try:
            last = predicate()
        except ActorUnavailableError:  # an actor restarting: not yet
            last = None
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def request(i: int = 0, model: str = MODEL) -> LLMRequest:
    return LLMRequest(request_id=f"r{i}", target_model=model, body={"model": model, "prompt": f"hello {i}"})


def pod_specs(sim) -> list[PodSpec]:
    return [PodSpec(name=p.name, address=p.address, port=p.port, labels=p.labels) for p in sim.pods]
