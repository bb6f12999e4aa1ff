"""The multi-cycle scheduling loop, written once for both execution paths (GIE's: the handler picks
profiles round after round until it picks none, then joins their results; a profile that ran and
failed keeps its entry as None; pkg/epp/scheduling/scheduler.go, PR #862 at 5bc74258 and PR #1013
at e29fa4b2).

`schedule_cycles` is a coroutine that takes a pluggable "run these profiles" step. In-process the
step runs the profiles in turn and never suspends, so `run_sync` drives the coroutine to its end
without an event loop; the Ray gateway awaits the same coroutine with a step that runs the
profiles of a round concurrently in profile actors."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Coroutine, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from scheduler.config.data_flow import preparing_producers
from scheduler.cycle_state import CycleState
from scheduler.errors import ErrorCode, SchedulingError
from scheduler.interfaces import DataPreparer, Plugin, PluginTimer, ProfileHandler
from scheduler.profile import produce_or_skip
from scheduler.trace import TRACE_NOTES_KEY, SchedulingTrace
from scheduler.types import Endpoint, LLMRequest, ProfileRunResult, SchedulingResult

# A handler that keeps picking profiles is a bug; fail the request rather than spin.
MAX_ROUNDS = 16

# CycleState keys the loop writes before the first round. CONCURRENT_ROUNDS_KEY: whether the
# runner runs the profiles of one round at the same time (its `concurrent` attribute; the Ray
# path's does), for handlers that choose between one round and several. CYCLE_SEED_KEY: one random
# draw per request, the seed of the cycle's random choices (scheduler/plugins/support/cycle_rng.py),
# so a profile run whose result is discarded leaves no trace in a plugin's generator.
CONCURRENT_ROUNDS_KEY = "scheduler/concurrent-rounds"
CYCLE_SEED_KEY = "scheduler/cycle-seed"
CYCLE_SEEDS = random.Random()

T = TypeVar("T")
log = logging.getLogger("ray_epp.scheduler.loop")


class ProfileRunner(Protocol):
    """Runs the profiles picked in one round; a profile that fails maps to None."""

    def __call__(
        self,
        names: list[str],
        request: LLMRequest,
        cycle_state: CycleState,
        endpoints: list[Endpoint] | None,
        trace: SchedulingTrace | None,
    ) -> Awaitable[dict[str, ProfileRunResult | None]]: ...


async def schedule_cycles(
    handler: ProfileHandler,
    profiles: Mapping[str, Any],
    run_profiles: ProfileRunner,
    request: LLMRequest,
    endpoints: list[Endpoint] | None,
    cycle_state: CycleState | None = None,
    trace: SchedulingTrace | None = None,
    timer: PluginTimer | None = None,
) -> SchedulingResult:
    cycle_state = cycle_state if cycle_state is not None else CycleState()
    cycle_state.write(CONCURRENT_ROUNDS_KEY, getattr(run_profiles, "concurrent", False))
    if CYCLE_SEED_KEY not in cycle_state:
        cycle_state.write(CYCLE_SEED_KEY, CYCLE_SEEDS.getrandbits(64))
    try:
        return await _cycles(handler, profiles, run_profiles, request, endpoints, cycle_state, trace, timer)
    finally:
        if trace is not None and (notes := cycle_state.read(TRACE_NOTES_KEY)):
            trace.extra.update(notes)  # what the handler and its deciders noted (e.g. P/D's decision)


async def _cycles(
    handler: ProfileHandler,
    profiles: Mapping[str, Any],
    run_profiles: ProfileRunner,
    request: LLMRequest,
    endpoints: list[Endpoint] | None,
    cycle_state: CycleState,
    trace: SchedulingTrace | None,
    timer: PluginTimer | None,
) -> SchedulingResult:
    results: dict[str, ProfileRunResult | None] = {}
    for _ in range(MAX_ROUNDS):
        start = time.perf_counter()
        picked = handler.pick(cycle_state, request, profiles, results)
        if timer is not None:
            timer("ProfilePicker", handler, time.perf_counter() - start)
        if not picked:
            break
        unknown = [name for name in picked if name not in profiles]
        if unknown:
            raise SchedulingError(ErrorCode.INTERNAL, f"profile handler picked unknown profiles {unknown}")
        names = list(picked)
        if trace is not None:
            trace.rounds.append(names)
        results.update(await run_profiles(names, request, cycle_state, endpoints, trace))
    else:
        raise SchedulingError(
            ErrorCode.INTERNAL, f"profile handler {handler.name!r} still picked profiles after {MAX_ROUNDS} rounds"
        )
    if not results:
        raise SchedulingError(
            ErrorCode.INTERNAL, f"failed to run any scheduler profile for request {request.request_id}"
        )
    start = time.perf_counter()
    result = handler.process_results(cycle_state, request, results)
    if timer is not None:
        timer("ProcessProfilesResults", handler, time.perf_counter() - start)
    return result


class DataPreparation:
    """What runs where a request arrives, before the first round: the config's DataPreparers (at the
    same time: each may wait), and first the producers whose keys they read
    (config.data_flow.preparing_producers: the token producer), in order, each off the event loop
    (it may ask a server), under the profiles' rule for a producer that raises (`failures` counts
    them). A preparer that fails is logged and the request goes on without what it would have
    written. False when the plugins have no preparer."""

    __slots__ = ("failures", "preparers", "producers")

    def __init__(self, plugins: Iterable[Plugin]) -> None:
        plugins = list(plugins)
        self.preparers = [p for p in plugins if isinstance(p, DataPreparer)]
        self.producers = preparing_producers(self.preparers, plugins)
        self.failures: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self.preparers)

    async def run(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> None:
        if not self.preparers:
            return
        failures = self.failures
        for producer in self.producers:
            await asyncio.to_thread(produce_or_skip, producer, cycle_state, request, endpoints, failures, "preparation")
        preparers = self.preparers
        outcomes = await asyncio.gather(
            *(p.prepare(cycle_state, request, endpoints) for p in preparers), return_exceptions=True
        )
        for p, outcome in zip(preparers, outcomes, strict=True):
            if isinstance(outcome, Exception):
                log.warning("data preparer %r failed on request %s: %s", p.name, request.request_id, outcome)
            elif isinstance(outcome, BaseException):
                raise outcome  # cancellation: the client left


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Drive a coroutine that never suspends (the in-process path) to its result."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("run_sync: the coroutine suspended; use an event loop for runners that await")
