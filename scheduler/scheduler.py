"""The in-process Scheduler: the multi-cycle loop with every profile run in this process."""

from __future__ import annotations

import random

from scheduler.config import build_plugins, load_config
from scheduler.cycle_state import CycleState, profile_error_key
from scheduler.errors import ErrorCode, SchedulingError
from scheduler.interfaces import Plugin, PluginHandle, PluginTimer, ProfileHandler
from scheduler.lifecycle import Lifecycle
from scheduler.loop import CYCLE_SEED_KEY, DataPreparation, run_sync, schedule_cycles
from scheduler.profile import SchedulerProfile
from scheduler.trace import ProfileTrace, SchedulingTrace
from scheduler.types import Endpoint, LLMRequest, ProfileRunResult, SchedulingResult


class Scheduler:
    """`schedule(request, endpoints)` returns a SchedulingResult or raises SchedulingError."""

    def __init__(
        self,
        handler: ProfileHandler,
        profiles: dict[str, SchedulerProfile],
        plugins: dict[str, Plugin] | None = None,
        timer: PluginTimer | None = None,
        saturation_detector: str | None = None,
    ) -> None:
        self.handler = handler
        self.saturation_detector = saturation_detector  # the one the config names for admission, if any
        self.profiles = profiles
        self.plugins = plugins if plugins is not None else _plugins_of(handler, profiles)
        self.timer = timer
        self.hooks = Lifecycle(self.plugins.values())  # every plugin runs in this process
        self.preparation = DataPreparation(self.hooks.plugins)
        self.preparers = self.preparation.preparers
        # Each cycle's seed (scheduler/plugins/support/cycle_rng.py); replace it to make runs repeat.
        self.cycle_seeds = random.Random()

    @classmethod
    def from_config(cls, config, timer: PluginTimer | None = None, handle: PluginHandle | None = None) -> Scheduler:
        """Build from a loaded config (`load_config`), YAML text, or a dict. `handle`: the plugins'
        clocks and the seed of their generators (the cluster simulation's virtual time)."""
        if not hasattr(config, "scheduling_profiles"):
            config = load_config(config)
        built = build_plugins(config, handle=handle)
        return cls(built.handler, built.profiles, built.plugins, timer, built.saturation_detector)

    def schedule(
        self,
        request: LLMRequest,
        endpoints: list[Endpoint],
        trace: SchedulingTrace | None = None,
        run_pre_request: bool = True,
    ) -> SchedulingResult:
        """Pick endpoints for one request; with `run_pre_request`, stateful plugins then learn
        the decision (in the Ray path the gateway tells the profile actors instead)."""
        if self.preparers:
            raise RuntimeError(
                f"{', '.join(p.type_name for p in self.preparers)} waits for other requests before scheduling; "
                "use `await Scheduler.aschedule(...)`"
            )
        cycle_state = self._cycle_state(endpoints)
        result = run_sync(
            schedule_cycles(
                self.handler, self.profiles, self._run_profiles, request, endpoints, cycle_state, trace, self.timer
            )
        )
        if run_pre_request:
            self.pre_request(request, result)
        return result

    async def aschedule(
        self,
        request: LLMRequest,
        endpoints: list[Endpoint],
        trace: SchedulingTrace | None = None,
        run_pre_request: bool = True,
    ) -> SchedulingResult:
        """`schedule` on an event loop: the config's DataPreparers (a burst window) run first, so
        concurrent calls see each other."""
        cycle_state = self._cycle_state(endpoints)
        await self.preparation.run(cycle_state, request, endpoints)
        result = await schedule_cycles(
            self.handler, self.profiles, self._run_profiles, request, endpoints, cycle_state, trace, self.timer
        )
        if run_pre_request:
            self.pre_request(request, result)
        return result

    def _cycle_state(self, endpoints: list[Endpoint]) -> CycleState:
        if not endpoints:
            raise SchedulingError(ErrorCode.SERVICE_UNAVAILABLE, "no endpoints to schedule on")
        cycle_state = CycleState()
        cycle_state.write(CYCLE_SEED_KEY, self.cycle_seeds.getrandbits(64))
        return cycle_state

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        self.hooks.pre_request(request, result)

    def response_headers(self, request: LLMRequest, result: SchedulingResult) -> dict[str, str]:
        """The headers ResponseHeader plugins add to the response for this decision (e.g.
        `x-session-token`); a caller that forwards the request itself sets them on its response."""
        return self.hooks.response_headers(request, result)

    def response_first_token(self, request: LLMRequest, endpoint_name: str) -> None:
        """Tell plugins that track prefill work that this request's first token has arrived."""
        self.hooks.response_first_token(request, endpoint_name)

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        """Tell plugins that count requests in flight that this request's response has been sent."""
        self.hooks.response_complete(request, endpoint_name)

    async def _run_profiles(
        self,
        names: list[str],
        request: LLMRequest,
        cycle_state: CycleState,
        endpoints: list[Endpoint] | None,
        trace: SchedulingTrace | None,
    ) -> dict[str, ProfileRunResult | None]:
        return {
            name: run_profile(self.profiles[name], request, cycle_state, endpoints or [], trace, self.timer)
            for name in names
        }


def run_profile(
    profile: SchedulerProfile,
    request: LLMRequest,
    cycle_state: CycleState,
    endpoints: list[Endpoint],
    trace: SchedulingTrace | None = None,
    timer: PluginTimer | None = None,
) -> ProfileRunResult | None:
    """Run one profile; its failure becomes None (a failed profile keeps its entry, as
    None: GIE PR #1013) and is recorded in the trace."""
    profile_trace = ProfileTrace(profile.name) if trace is not None else None
    try:
        return profile.run(request, cycle_state, endpoints, profile_trace, timer)
    except SchedulingError as err:
        cycle_state.write(profile_error_key(profile.name), err)
        if profile_trace is not None:
            profile_trace.error = err.message
        return None
    finally:
        if trace is not None and profile_trace is not None:
            trace.profiles[profile.name] = profile_trace.to_json()


def _plugins_of(handler: ProfileHandler, profiles: dict[str, SchedulerProfile]) -> dict[str, Plugin]:
    plugins: dict[str, Plugin] = {handler.name: handler}
    for profile in profiles.values():
        for p in profile.plugins():
            plugins.setdefault(p.name, p)
    return plugins
