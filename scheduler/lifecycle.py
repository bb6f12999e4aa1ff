"""The request lifecycle of a set of plugins, dispatched in one place (`Lifecycle`): each event of
`LifecycleEvent` goes to the plugins that declare its role, in config order. The in-process
Scheduler uses it for all its plugins, each profile actor and each Serve router's mirror for the
plugins of one profile, the gateway replica for the plugins placed there (scheduler/placement.py):
one rule everywhere. An event that crosses a process (a gateway's decision to a profile actor, a
router's to the others) carries its `LifecycleEvent`, and the receiver hands it to `deliver`.

The rule is GIE's (kubernetes-sigs/gateway-api-inference-extension, pkg/epp/requestcontrol/
director.go at 014fd184a61d: a plugin is a PreRequest plugin when it implements that interface,
and `runPreRequestPlugins` runs after scheduling, its hooks returning no error):

* a plugin gets an event only if it declares the role (`isinstance(plugin, PreRequest)`);
  a method of the same name on a plugin that does not declare the role is not called;
* a hook that raises is logged and counted in `errors`; the other plugins' hooks still run and
  the decision already made stands (an error there does not un-schedule the request)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any, TypeVar

from scheduler.interfaces import (
    DataPreparer,
    KVEventSink,
    Plugin,
    PreRequest,
    ResponseComplete,
    ResponseFirstToken,
    ResponseHeader,
    ResponseUsage,
    TentativePreRequest,
)
from scheduler.types import LLMRequest, SchedulingResult

log = logging.getLogger("ray_epp.scheduler.lifecycle")

R = TypeVar("R", bound=Plugin)


class LifecycleEvent(StrEnum):
    """What happens to a request after it arrives, in order, and to a pod's KV cache."""

    PREPARE = "prepare"  # before the scheduling cycles (DataPreparer)
    TENTATIVE = "tentative"  # a profile actor's own decision, not final yet (TentativePreRequest)
    WITHDRAW = "withdraw"  # a tentative decision that will not become final (TentativePreRequest)
    PRE_REQUEST = "pre_request"  # the final decision, before the request is sent (PreRequest)
    RESPONSE_HEADERS = "response_headers"  # the response starts (ResponseHeader)
    FIRST_TOKEN = "first_token"  # a stream's first token arrived (ResponseFirstToken)
    RESPONSE_USAGE = "response_usage"  # the response carried its token usage (ResponseUsage)
    RESPONSE_COMPLETE = "response_complete"  # the response was sent in full (ResponseComplete)
    KV_EVENTS = "kv_events"  # a pod's KV-cache event batches (KVEventSink)
    KV_EVENT_STATUS = "kv_event_status"  # a pod's KV-event stream changed state (KVEventSink)


# Each event's role, and the role's method that hears it.
EVENT_ROLES: dict[LifecycleEvent, tuple[type[Plugin], str]] = {
    LifecycleEvent.PREPARE: (DataPreparer, "prepare"),
    LifecycleEvent.TENTATIVE: (TentativePreRequest, "pre_request"),
    LifecycleEvent.WITHDRAW: (TentativePreRequest, "withdraw"),
    LifecycleEvent.PRE_REQUEST: (PreRequest, "pre_request"),
    LifecycleEvent.RESPONSE_HEADERS: (ResponseHeader, "response_headers"),
    LifecycleEvent.FIRST_TOKEN: (ResponseFirstToken, "response_first_token"),
    LifecycleEvent.RESPONSE_USAGE: (ResponseUsage, "response_usage"),
    LifecycleEvent.RESPONSE_COMPLETE: (ResponseComplete, "response_complete"),
    LifecycleEvent.KV_EVENTS: (KVEventSink, "apply_kv_events"),
    LifecycleEvent.KV_EVENT_STATUS: (KVEventSink, "set_kv_event_status"),
}

# The events a request's hooks hear (what `__bool__` asks about): not the KV feed, not PREPARE.
REQUEST_EVENTS = (
    LifecycleEvent.PRE_REQUEST,
    LifecycleEvent.RESPONSE_HEADERS,
    LifecycleEvent.FIRST_TOKEN,
    LifecycleEvent.RESPONSE_USAGE,
    LifecycleEvent.RESPONSE_COMPLETE,
)


class Lifecycle:
    """The plugins of one process (or one profile), sorted once by the events they hear."""

    __slots__ = ("_by_event", "_plugins", "errors")

    def __init__(self, plugins: Iterable[Plugin]) -> None:
        seen: dict[int, Plugin] = {}
        for plugin in plugins:
            seen.setdefault(id(plugin), plugin)
        self._plugins = list(seen.values())
        self._by_event: dict[LifecycleEvent, list[Plugin]] = {
            event: [p for p in self._plugins if isinstance(p, role)] for event, (role, _) in EVENT_ROLES.items()
        }
        self.errors = 0  # hook calls that raised, since this dispatcher was built

    def __bool__(self) -> bool:
        return any(self._by_event[e] for e in REQUEST_EVENTS)

    def hears(self, event: LifecycleEvent) -> bool:
        """Whether any plugin here hears `event` (e.g. whether responses need parsing for usage)."""
        return bool(self._by_event[event])

    def having(self, role: type[R]) -> list[R]:
        """The plugins here that declare `role`, in config order (responders, preparers, sinks)."""
        return [p for p in self._plugins if isinstance(p, role)]

    @property
    def plugins(self) -> list[Plugin]:
        return list(self._plugins)

    # --- the events ---------------------------------------------------------------------------

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        self._emit(LifecycleEvent.PRE_REQUEST, request, result)

    @property
    def takes_tentative(self) -> bool:
        """Whether any plugin learns decisions before they are final (actors/tentative_decisions.py)."""
        return self.hears(LifecycleEvent.TENTATIVE)

    def tentative_pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        """A decision made but not final: only the TentativePreRequest plugins learn it."""
        self._emit(LifecycleEvent.TENTATIVE, request, result)

    def withdraw(self, request: LLMRequest) -> None:
        """A tentative decision that will not become final is taken back."""
        self._emit(LifecycleEvent.WITHDRAW, request)

    def response_headers(self, request: LLMRequest, result: SchedulingResult) -> dict[str, str]:
        """The headers the ResponseHeader plugins add to the client's response, in plugin order
        (a later plugin's value for the same header wins)."""
        headers: dict[str, str] = {}
        for added in self._emit(LifecycleEvent.RESPONSE_HEADERS, request, result):
            if added:
                headers.update(added)
        return headers

    def response_first_token(self, request: LLMRequest, endpoint_name: str) -> None:
        self._emit(LifecycleEvent.FIRST_TOKEN, request, endpoint_name)

    def response_usage(self, request: LLMRequest, prompt_tokens: int, completion_tokens: int) -> None:
        self._emit(LifecycleEvent.RESPONSE_USAGE, request, prompt_tokens, completion_tokens)

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        self._emit(LifecycleEvent.RESPONSE_COMPLETE, request, endpoint_name)

    def deliver(
        self,
        event: LifecycleEvent,
        request: LLMRequest,
        result: SchedulingResult | None = None,
        endpoint_name: str | None = None,
    ) -> None:
        """An event that came from another process (a gateway's, a Serve router's): the one place
        its kind picks the hook. An event without what its hook needs is ignored; one that does
        not travel between processes is a ValueError."""
        event = LifecycleEvent(event)
        if event is LifecycleEvent.PRE_REQUEST or event is LifecycleEvent.TENTATIVE:
            if result is not None:
                self._emit(event, request, result)
        elif event is LifecycleEvent.FIRST_TOKEN or event is LifecycleEvent.RESPONSE_COMPLETE:
            if endpoint_name is not None:
                self._emit(event, request, endpoint_name)
        elif event is LifecycleEvent.WITHDRAW:
            self._emit(event, request)
        else:
            raise ValueError(f"lifecycle event {event.value!r} does not travel between processes")

    def kv_events(self, pod: str, batches: list[Any]) -> int:
        """A pod's next KV-event batches, oldest first, to every KVEventSink; returns how many."""
        sinks = self._by_event[LifecycleEvent.KV_EVENTS]
        for sink in sinks:
            sink.apply_kv_events(pod, batches)  # type: ignore[attr-defined]
        return len(sinks)

    def kv_event_status(self, pod: str, status: str) -> int:
        """A pod's KV-event stream changed state (`live`, `gapped`, `silent`, `gone`)."""
        sinks = self._by_event[LifecycleEvent.KV_EVENT_STATUS]
        for sink in sinks:
            sink.set_kv_event_status(pod, status)  # type: ignore[attr-defined]
        return len(sinks)

    def _emit(self, event: LifecycleEvent, request: LLMRequest, *args: Any) -> list[Any]:
        method = EVENT_ROLES[event][1]
        return [self._run(p, getattr(p, method), request, *args) for p in self._by_event[event]]

    def _run(self, plugin: Plugin, method: Callable[..., Any], request: LLMRequest, *args: Any) -> Any:
        try:
            return method(request, *args)
        except Exception as err:  # a plugin's bug must not lose the other plugins' updates
            self.errors += 1
            log.warning(
                "%s of plugin %r failed on request %s: %s: %s",
                method.__name__, plugin.name, request.request_id, type(err).__name__, err,
                exc_info=self.errors == 1,  # the first traceback; then one line each
            )  # fmt: skip
            return None
