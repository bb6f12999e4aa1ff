"""The extension points of the scheduling framework, in one place (GIE's framework/interface).

A plugin is a class with a registered `type_name` and a pydantic `Parameters` model; the loader
builds it from config. A plugin may fill several roles (e.g. a scorer that is also a PreRequest
hook). The roles are abstract classes: a plugin class that misses a method of a role it declares
can not be built, so `load_config` names it at load time rather than the first request failing.
Filters, scorers and pickers return no error (GIE's framework contract): a filter that removes
every endpoint is how a profile fails."""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from scheduler.cycle_state import CycleState
from scheduler.data_keys import DataKey
from scheduler.flowcontrol.types import FlowItem, FlowQueue
from scheduler.types import Endpoint, LLMRequest, ProfileRunResult, SchedulingResult, ScoredEndpoint

P = TypeVar("P", bound="Plugin")


class Parameters(BaseModel):
    """Base of every plugin's parameters: GIE's camelCase names, unknown fields rejected."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class NoParameters(Parameters):
    pass


class PluginHandle:
    """What a plugin sees of the process that builds it: its siblings by name (while the config is
    built), the clocks it reads and the random generator it draws from. A plugin takes its clock
    and generator here in `setup`, so whoever builds the plugins decides them (the cluster
    simulation: its virtual time and seeded generators) instead of patching them in afterwards.
    A plugin built outside a config (tests, defaults made in code) gets one with no siblings, the
    real clocks and an unseeded generator.

    `clock` is monotonic seconds (intervals, timeouts); `wall_clock` Unix seconds (what metrics'
    `update_time` is written in). `rng` is this plugin's own generator: seeded with the build's
    `seed` and the plugin's name when the build has a seed, so a run repeats decision for decision."""

    __slots__ = ("_names", "_resolve", "_rng", "clock", "owner", "seed", "wall_clock")

    def __init__(
        self,
        resolve: Callable[[str], Plugin] | None = None,
        names: list[str] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        seed: int | str | None = None,
        owner: str = "",
    ) -> None:
        self._resolve = resolve
        self._names = list(names or ())
        self.clock = clock
        self.wall_clock = wall_clock
        self.seed = seed
        self.owner = owner  # the plugin this handle was given to ("" before it is)
        self._rng: random.Random | None = None

    def for_plugin(self, name: str) -> PluginHandle:
        """The same handle for the plugin called `name`: its own generator."""
        return PluginHandle(
            self._resolve, self._names, clock=self.clock, wall_clock=self.wall_clock, seed=self.seed, owner=name
        )

    def with_siblings(self, resolve: Callable[[str], Plugin], names: list[str]) -> PluginHandle:
        """The same clocks and seed, seeing the plugins of a config being built."""
        return PluginHandle(resolve, names, clock=self.clock, wall_clock=self.wall_clock, seed=self.seed)

    @property
    def rng(self) -> random.Random:
        """This plugin's generator (the same one on every access)."""
        if self._rng is None:
            self._rng = random.Random() if self.seed is None else random.Random(f"{self.seed}:{self.owner}")
        return self._rng

    def plugin(self, name: str) -> Plugin:
        """The instance configured under `name` (built on demand); KeyError if there is none."""
        if self._resolve is None:
            raise KeyError(f"no plugin named {name!r}: this plugin was built outside a config")
        return self._resolve(name)

    def plugin_names(self) -> list[str]:
        return list(self._names)

    def plugin_of_type(self, name: str, cls: type[P], field: str) -> P:
        """The plugin `name` names (through parameter `field`), which must be a `cls`; a ValueError
        saying which is wrong otherwise (a config error at load time)."""
        if name not in self._names:
            raise ValueError(f"{field} {name!r} names no plugin in 'plugins'")
        plugin = self.plugin(name)
        if not isinstance(plugin, cls):
            raise ValueError(f"{field} {name!r} is {_a(plugin.type_name)}, not {_a(cls.type_name)}")
        return plugin


def _a(type_name: str) -> str:
    return f"{'an' if type_name[:1] in 'aeiou' else 'a'} {type_name}"


class Plugin(ABC):  # noqa: B024 (the abstract methods are those of the roles a plugin declares)
    """Base of all plugins. `name` is the instance name from config (defaults to the type).

    `consumes` lists the data keys the plugin reads from the cycle state (llm-d's Consumes()); a
    plugin whose keys depend on its parameters (the producer it names) sets it in `setup`. The
    config build finds each key's producer and fails, naming the plugin and the key, when none."""

    type_name: ClassVar[str] = ""
    Parameters: ClassVar[type[Parameters]] = NoParameters
    # The fields of a request's body the plugin reads, by name (scheduler/body_fields.py): a profile
    # actor gets only those its config's plugins declare. A class's and its bases' add up.
    body_fields: ClassVar[frozenset[str]] = frozenset()
    consumes: tuple[DataKey[Any], ...] = ()

    def __init__(self, name: str | None = None, params: Any = None, handle: PluginHandle | None = None) -> None:
        self.name = name or self.type_name
        self.params = params if params is not None else self.Parameters()
        self.setup(handle if handle is not None else PluginHandle(owner=self.name))

    def setup(self, handle: PluginHandle) -> None:  # noqa: B027 (optional: most plugins need no setup)
        """Hook for plugins that derive state from their parameters or look up other plugins."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Producer(Plugin):
    """Derives data from the request and the endpoints for the other plugins of a profile (llm-d's
    DataProducer): the profile runs its producers, in the order their keys need, after its screeners
    and before its filters, and each writes the keys it declares in `produces` (`cycle_state.put`),
    usually its own name's (`KEY.of(self.name)`). Filters and scorers read the keys and never call
    a producer. A producer may consume another's keys (it then runs after it)."""

    produces: tuple[DataKey[Any], ...] = ()
    # Data names (DataKey.name) read if the profile runs their producer, then run before this; none required.
    runs_after: tuple[str, ...] = ()

    @abstractmethod
    def produce(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> None:
        """Write this producer's keys for `endpoints` (the profile's pool before its filters)."""


class Filter(Plugin):
    @abstractmethod
    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        """The endpoints this request may go to (a subset of `endpoints`, in any order)."""


class ScorerCategory(StrEnum):
    """What a scorer pulls towards: GIE's three categories."""

    AFFINITY = "Affinity"  # towards endpoints that hold something for this request (cache, adapter)
    DISTRIBUTION = "Distribution"  # spread load evenly
    BALANCE = "Balance"  # a mix of both


class Scorer(Plugin):
    category: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION

    @abstractmethod
    def score(
        self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]
    ) -> Mapping[Endpoint, float]:
        """A score per endpoint, ideally in [0, 1]; the profile clamps it. Missing endpoints score 0."""


class Picker(Plugin):
    @abstractmethod
    def pick(self, cycle_state: CycleState, scored: list[ScoredEndpoint]) -> ProfileRunResult:
        """The chosen endpoints (the first is the target), from the scored candidates."""


class ProfileHandler(Plugin):
    """Decides which profiles run in each round and joins their results (GIE's multi-cycle
    scheduler: PR #862, 5bc74258, and PR #1013, e29fa4b2, pkg/epp/scheduling/scheduler.go).

    `profiles` maps names to profile handles that are opaque to the handler: in-process they are
    `SchedulerProfile`s, in the Ray path references to profile actors."""

    def validate_profiles(self, profile_names: list[str]) -> list[str]:
        """Errors when the configured profiles do not fit this handler (checked at load time)."""
        return []

    @abstractmethod
    def pick(
        self,
        cycle_state: CycleState,
        request: LLMRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileRunResult | None],
    ) -> dict[str, Any]:
        """The profiles to run in the next round (a subset of `profiles`); empty ends the loop."""

    @abstractmethod
    def process_results(
        self, cycle_state: CycleState, request: LLMRequest, results: Mapping[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        """The final result, or raise SchedulingError when the request must fail."""


class PreRequest(Plugin):
    """Runs after the decision, before the request is sent (GIE's PreRequest): stateful plugins
    learn where the request went. Every plugin instance that has it is told every decision."""

    @abstractmethod
    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None: ...


class TentativePreRequest(PreRequest):
    """A PreRequest that may learn a decision before it is final (a Ray EPP extension): a profile
    actor tells it each of its own profile's results as soon as it is made, with that one profile
    in the result, so the next call decided on the same snapshot (the rest of a batch, the batches
    before the final PreRequest arrives) sees it instead of the whole burst herding onto the one
    endpoint that looked emptiest. The plugin's `pre_request` must replace an earlier one for the
    same request id (a ledger keyed by request), so the final decision simply overwrites the
    tentative one; `withdraw` takes back a tentative decision that never became final (the
    request failed before it was sent)."""

    @abstractmethod
    def withdraw(self, request: LLMRequest) -> None: ...


class DataPreparer(Plugin):
    """Runs before the scheduling cycles and may wait (llm-d's DataProducer with a ProduceTimeout,
    e.g. the burst prefix producer's batch window). It runs where the request arrives (the gateway,
    or `Scheduler.aschedule`) and writes what it found into the cycle state, which travels with the
    request to the plugins that read it. One that raises is logged and the request scheduled
    without it, as llm-d's Director logs a failed producer and continues."""

    @abstractmethod
    async def prepare(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> None: ...


class ResponseFirstToken(Plugin):
    """Runs when the first token of a streamed response arrives from the model server (a Ray EPP
    extension point; GIE's ResponseStreaming runs per chunk, too often to cross a process): plugins
    that track prefill work learn it is done. A non-streamed response only gets ResponseComplete."""

    @abstractmethod
    def response_first_token(self, request: LLMRequest, endpoint_name: str) -> None: ...


class ResponseComplete(Plugin):
    """Runs when the response to a scheduled request has been sent in full (llm-d's ResponseBody
    at end of stream): plugins that count requests in flight learn that one has finished."""

    @abstractmethod
    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None: ...


class ResponseUsage(Plugin):
    """Learns what a served request cost, from the OpenAI `usage` of its response (llm-d's
    ResponseBody at end of stream, read for its usage): called by the gateway replica that answered,
    on its own instance (a flow-control policy lives there), once the response has been sent, when
    the response carried usage (a streamed one does only with `stream_options.include_usage`)."""

    @abstractmethod
    def response_usage(self, request: LLMRequest, prompt_tokens: int, completion_tokens: int) -> None: ...


class ResponseHeader(Plugin):
    """Adds headers to the response the client gets (llm-d's ResponseHeaderProcessor), e.g. the
    session token a client echoes to come back to its endpoint. It runs in the gateway replica
    that answers, on that replica's own instance of the plugin, when the response starts: what it
    writes must follow from the request and the decision, not from state kept in a profile actor."""

    @abstractmethod
    def response_headers(self, request: LLMRequest, result: SchedulingResult) -> Mapping[str, str]: ...


class Screener(Plugin):
    """Narrows the pool to the endpoints a request may go to before any profile runs (llm-d's
    request-control Screener), e.g. to those that serve its model. It is configured outside the
    profiles and applies to every one of them; like a filter it returns no error, but it must not
    return an empty list for a non-empty pool (it keeps everyone when it can not tell)."""

    @abstractmethod
    def screen(self, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]: ...


@dataclass(slots=True)
class LocalResponse:
    """An answer the gateway gives itself, without forwarding the request (a Responder's): a
    JSON `body`, or an OpenAI-shaped error when `status` is not 2xx (`body` then holds the message)."""

    status: int
    body: Any


class Responder(Plugin):
    """Answers some requests at the gateway instead of sending them to a model server (llm-d's
    request-control Responder), e.g. `GET /v1/models` for the whole pool. `endpoints` are the
    pool as the answering replica sees it. None declines: the request goes on as usual."""

    @abstractmethod
    def respond(self, method: str, path: str, endpoints: list[Endpoint]) -> LocalResponse | None: ...


class SaturationDetector(Plugin):
    """Says whether the pool is saturated (GIE's SaturationDetector): the gateway then sheds
    sheddable requests (priority < 0) with 429 before scheduling them, or, with flow control on,
    holds every request in its queue. Declared in `plugins`; it need not be in a profile
    (scheduler/admission.py collects them).

    `per_request` marks llm-d's Admitters modelled as detectors (e.g. `probabilistic-admitter`):
    asked once per sheddable request, always, even when the config names its saturation detector."""

    per_request: ClassVar[bool] = False

    @abstractmethod
    def is_pool_saturated(self, endpoints: list[Endpoint]) -> bool: ...

    def saturation(self, endpoints: list[Endpoint]) -> float:
        """How full the pool is, 0 idle to 1 saturated (llm-d's Saturation(); may exceed 1): what a
        usage-limit policy compares each band's ceiling with. A detector that only answers yes or no
        is 1 or 0."""
        return 1.0 if self.is_pool_saturated(endpoints) else 0.0


class OrderingPolicy(Plugin):
    """Orders the requests within one flow's queue (GIE / llm-d flow control's OrderingPolicy):
    the smallest key is dispatched first. One policy per priority band, so every flow of a band
    compares alike."""

    @abstractmethod
    def key(self, item: FlowItem) -> tuple: ...


class FairnessPolicy(Plugin):
    """Chooses which flow of a priority band dispatches next (GIE / llm-d flow control's
    FairnessPolicy). `flows` are the band's non-empty queues in a stable order; `state` is the
    band's own scratch space for a policy that keeps some (a round-robin cursor), so one policy
    instance can serve several bands."""

    @abstractmethod
    def pick(self, flows: list[FlowQueue], state: dict[str, Any]) -> FlowQueue: ...


class UsageLimitPolicy(Plugin):
    """Which priority bands of the flow-control queue may dispatch at the pool's saturation (llm-d's
    UsageLimitPolicy): one ceiling per band, `priorities` highest first; a band whose ceiling is at
    or below the saturation is held, and so is every band after it (the queue stops at the first).
    Ceilings must not rise from a higher band to a lower one. Called once per dispatch cycle."""

    @abstractmethod
    def ceilings(self, saturation: float, priorities: list[int]) -> list[float]: ...


class PDDecider(Plugin):
    """Decides, once the decode profile has picked its endpoint, whether a disaggregated stage runs
    for this request (llm-d's decider plugins): the prefill stage of P/D, or the encode stage of
    E/P/D. Configured as a plugin outside any profile and named by the `disagg-profile-handler`.

    With the handler's `parallelStages`, a stage whose decider `might_disaggregate` runs beside
    decode in one round and is discarded if `disaggregate` then says no. A decider that needs more
    than the same round's decode target (e.g. another stage's result) sets `parallel_round = False`:
    its stage then runs in a later round, as without the option."""

    parallel_round: bool = True

    @abstractmethod
    def disaggregate(self, cycle_state: CycleState, request: LLMRequest, decode_endpoint: Endpoint) -> bool: ...

    def might_disaggregate(self, cycle_state: CycleState, request: LLMRequest) -> bool:
        """False only when `disaggregate` will say no whatever the decode target (e.g. the prompt is
        too short); True otherwise. Must not change any state."""
        return True


class KVEventSink(Plugin):
    """Consumes model servers' KV-cache events (vLLM's KV events: blocks stored, removed, all
    cleared). The runtime finds every plugin with this role (`Lifecycle.having`), subscribes to each
    pod's event stream while the pod is in the pool, and feeds the sinks each pod's batches in
    order, and the stream's status when it changes (`live`, `gapped`, `silent`)."""

    @abstractmethod
    def apply_kv_events(self, pod: str, batches: list[Any]) -> None:
        """A pod's next event batches (`kvevents.KVEventBatch`), oldest first."""

    @abstractmethod
    def set_kv_event_status(self, pod: str, status: str) -> None:
        """A pod's event stream is `live`, `gapped` (messages lost and not replayed) or `silent`
        (nothing for too long); a pod that left the pool is `gone`."""

    @abstractmethod
    def kv_event_port(self) -> int:
        """The ZMQ port a pod publishes on when its spec names none (llm-d's socketPort)."""


class ReportsGauges(Plugin):
    """A plugin with Prometheus gauges of its own that the process hosting it publishes beside its
    own families (program-aware-fairness: llm-d's per-program gauges, read by the gateway replica
    whose queue it ranks)."""

    @abstractmethod
    def gauges(self) -> dict[tuple[str, tuple[str, ...]], float]:
        """The gauges now, keyed (metric name, label values) as a metrics recorder keeps them."""


class PluginTimer(Protocol):
    """Receives how long each plugin call took (for `…_plugin_duration_seconds`)."""

    def __call__(self, extension_point: str, plugin: Plugin, seconds: float) -> None: ...


class PluginMetrics(Protocol):
    """Where a plugin records Prometheus families of its own (GIE's and llm-d's plugin metrics,
    e.g. the prefix indexer's): the recorder of the process that hosts it. A plugin that has some
    defines `bind_metrics(metrics: PluginMetrics)`; a profile actor binds its plugins once
    (`bind_plugin_metrics`), and an unbound plugin records nothing (the in-process Scheduler)."""

    def observe(self, name: str, value: float, labels: tuple[str, ...] = ()) -> None: ...

    def add_collector(self, collector: Callable[[], dict[tuple[str, tuple[str, ...]], float]]) -> None:
        """Also report what `collector` returns, each time the recorder's state is taken."""


def bind_plugin_metrics(plugins: Iterable[Plugin], metrics: PluginMetrics) -> int:
    """Bind `metrics` to every plugin that records families of its own, each once; returns how many."""
    bound: set[int] = set()
    for plugin in plugins:
        bind = getattr(plugin, "bind_metrics", None)
        if bind is not None and id(plugin) not in bound:
            bound.add(id(plugin))
            bind(metrics)
    return len(bound)


ROLES: tuple[type[Plugin], ...] = (
    Filter, Scorer, Picker, ProfileHandler, PDDecider, SaturationDetector, PreRequest, ResponseFirstToken,
    ResponseComplete, ResponseHeader, OrderingPolicy, FairnessPolicy, KVEventSink, UsageLimitPolicy, Screener,
    Responder, ResponseUsage, DataPreparer, Producer, ReportsGauges,
)  # fmt: skip


def roles_of(plugin: Plugin | type[Plugin]) -> list[str]:
    cls = plugin if isinstance(plugin, type) else type(plugin)
    return [role.__name__ for role in ROLES if issubclass(cls, role)]
