"""Our scheduler, any EndpointPickerConfig, as a cluster-simulation router.

* Reproducible: the plugins' random tie-breaks (`max-score-picker`, `random-picker`, the LoRA
  filter) draw from generators seeded with `seed` and the plugin's name, so a run with a given
  seed gives the same decisions every time.
* Pods -> endpoints: each PodView becomes an `Endpoint` whose `Metrics` are the pod's last scraped
  metrics, with `update_time` set from the scrape time. The scheduler's clocks (every plugin's
  `clock`, e.g. the utilization detector's staleness check) are pointed at the simulation's
  virtual clock, so a metric is exactly as stale as the simulation made it.
* Requests -> `LLMRequest`: id, model, OpenAI body, headers and priority (< 0 is sheddable).
* Admission, as the gateway does it (serve_app.gateway.GatewayCore.admit) before scheduling: a
  sheddable request is shed while the pool is saturated — any of the config's saturation detectors,
  plus GIE's utilization detector (queue 5, KV 0.8) if it declares none (scheduler.admission).
  A ResourceExhausted from the scheduler (e.g. the legacy filter tree dropping a sheddable request)
  is a shed too; any other SchedulingError is an error. Both answer None (the simulation's drop)
  and are told apart in `shed` / `errors`.
* `Scheduler.schedule` runs the PreRequest hooks, so the prefix index learns each decision;
  `on_first_token` calls `response_first_token` (the gateway sees the first streamed chunk) and
  `on_complete` calls `response_complete` for plugins that count work in flight.
* P/D configs: when the result has a prefill target (the handler's prefill profile, else GIE's
  "prefill"), the answer is (prefill pod, decode pod)."""

from __future__ import annotations

import random
from pathlib import Path

from scheduler import Endpoint, LLMRequest, Metrics, Scheduler, SchedulingError, load_config_file
from scheduler.admission import admission_detectors, pool_saturated
from scheduler.errors import ErrorCode
from scheduler.types import SchedulingResult
from simulator import PodView, RequestResult, SimRequest

# Virtual time + this is what the scheduler's clocks read: update_time 0 means "not tracked".
VIRTUAL_EPOCH = 1_000_000.0
PREFILL_PROFILE = "prefill"


class SchedulerRouter:
    def __init__(self, config: str | Path | Scheduler, *, admission: bool = True, seed: int = 0) -> None:
        self.scheduler = config if isinstance(config, Scheduler) else Scheduler.from_config(load_config_file(config))
        self.admission = admission
        self.now = 0.0
        clock = self.virtual_clock
        for name, plugin in self.scheduler.plugins.items():
            if callable(getattr(plugin, "clock", None)):
                plugin.clock = clock  # type: ignore[attr-defined]
            if isinstance(getattr(plugin, "rng", None), random.Random):
                plugin.rng = random.Random(f"{seed}:{name}")  # type: ignore[attr-defined]
                if hasattr(plugin, "rng_salt"):  # draws per cycle (cycle_rng): salt from the seeded generator
                    plugin.rng_salt = plugin.rng.getrandbits(64)  # type: ignore[attr-defined]
        self.scheduler.cycle_seeds = random.Random(f"{seed}:cycles")
        self.detectors = admission_detectors(self.scheduler.plugins.values(), named=self.scheduler.saturation_detector)
        for detector in self.detectors:
            detector.clock = clock  # type: ignore[attr-defined]
        self.shed: set[str] = set()
        self.errors: dict[str, str] = {}
        self._endpoints: dict[str, tuple[dict, float, Endpoint]] = {}
        self._requests: dict[str, LLMRequest] = {}

    def virtual_clock(self) -> float:
        return VIRTUAL_EPOCH + self.now

    def endpoint(self, pod: PodView) -> Endpoint:
        """The pod as an Endpoint, rebuilt only when a scrape gave it new metrics."""
        cached = self._endpoints.get(pod.name)
        if cached is not None and cached[0] is pod.metrics and cached[1] == pod.scraped_at:
            return cached[2]
        metrics = Metrics.from_json(pod.metrics)
        metrics.update_time = VIRTUAL_EPOCH + pod.scraped_at
        ep = Endpoint(name=pod.name, labels=dict(pod.labels), metrics=metrics)
        self._endpoints[pod.name] = (pod.metrics, pod.scraped_at, ep)
        return ep

    def route(self, request: SimRequest, pods: list[PodView], now: float) -> str | tuple[str, str] | None:
        self.now = now
        endpoints = [self.endpoint(p) for p in pods]
        req = LLMRequest(
            request_id=request.request_id,
            target_model=request.model,
            body=request.body,
            headers=dict(request.headers),
            priority=request.priority,
        )
        if self.admission and req.sheddable and pool_saturated(self.detectors, endpoints):
            self.shed.add(request.request_id)
            return None
        try:
            result = self.scheduler.schedule(req, endpoints)
        except SchedulingError as err:
            if err.code == ErrorCode.RESOURCE_EXHAUSTED:
                self.shed.add(request.request_id)
            else:
                self.errors[request.request_id] = f"{err.code.value}: {err.message}"
            return None
        self._requests[request.request_id] = req
        decode = result.target.name
        prefill = prefill_target(result)
        return (prefill, decode) if prefill is not None and prefill != decode else decode

    def on_first_token(self, request: SimRequest, pod: str, now: float) -> None:
        req = self._requests.get(request.request_id)
        if req is not None:
            self.now = now
            self.scheduler.response_first_token(req, pod)

    def on_complete(self, request: SimRequest, pod: str | None, result: RequestResult) -> None:
        req = self._requests.pop(request.request_id, None)
        if req is not None and pod is not None:
            self.scheduler.response_complete(req, pod)


def prefill_target(result: SchedulingResult) -> str | None:
    """The prefill profile's endpoint when the result has one apart from the primary profile."""
    name = result.prefill_profile_name or PREFILL_PROFILE
    if name == result.primary_profile_name:
        return None
    prefill = result.profile_results.get(name)
    return prefill.target_endpoints[0].name if prefill is not None and prefill.target_endpoints else None
