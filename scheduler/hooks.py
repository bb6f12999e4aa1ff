"""The request-lifecycle hooks of a set of plugins, dispatched in one place: PreRequest after the
decision, ResponseHeader when the response starts, ResponseFirstToken when a stream's first token
arrives, ResponseUsage when a response carried its token usage, ResponseComplete at the end; and
for the profile actors, a decision made but not yet final to the TentativePreRequest plugins.
The in-process Scheduler uses it for all its plugins, each profile actor for its profile's
plugins, the gateway for the detectors it keeps locally: one rule everywhere.

The rule is GIE's (kubernetes-sigs/gateway-api-inference-extension, pkg/epp/requestcontrol/
director.go at 014fd184a61d: a plugin is a PreRequest plugin when it implements that interface,
and `runPreRequestPlugins` runs after scheduling, its hooks returning no error):

* a plugin gets a hook only if it declares the interface (`isinstance(plugin, PreRequest)`);
  a method of the same name on a plugin that does not declare the role is not called;
* a hook that raises is logged and counted in `errors`; the other plugins' hooks still run and
  the decision already made stands (an error there does not un-schedule the request)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from scheduler.interfaces import (
    Plugin,
    PreRequest,
    ResponseComplete,
    ResponseFirstToken,
    ResponseHeader,
    ResponseUsage,
    TentativePreRequest,
)
from scheduler.types import LLMRequest, SchedulingResult

log = logging.getLogger("ray_epp.scheduler.hooks")


class RequestHooks:
    __slots__ = ("_complete", "_first_token", "_headers", "_pre_request", "_tentative", "_usage", "errors")

    def __init__(self, plugins: Iterable[Plugin]) -> None:
        plugins = list(plugins)
        self._pre_request = [p for p in plugins if isinstance(p, PreRequest)]
        self._tentative = [p for p in plugins if isinstance(p, TentativePreRequest)]
        self._first_token = [p for p in plugins if isinstance(p, ResponseFirstToken)]
        self._complete = [p for p in plugins if isinstance(p, ResponseComplete)]
        self._headers = [p for p in plugins if isinstance(p, ResponseHeader)]
        self._usage = [p for p in plugins if isinstance(p, ResponseUsage)]
        self.errors = 0  # hook calls that raised, since this dispatcher was built

    def __bool__(self) -> bool:
        return bool(self._pre_request or self._first_token or self._complete or self._headers or self._usage)

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        for hook in self._pre_request:
            self._run(hook, hook.pre_request, request, result)

    @property
    def takes_tentative(self) -> bool:
        """Whether any plugin learns decisions before they are final (actors/tentative_decisions.py)."""
        return bool(self._tentative)

    def tentative_pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        """A decision made but not final: only the TentativePreRequest plugins learn it."""
        for hook in self._tentative:
            self._run(hook, hook.pre_request, request, result)

    def withdraw(self, request: LLMRequest) -> None:
        """A tentative decision that will not become final is taken back."""
        for hook in self._tentative:
            self._run(hook, hook.withdraw, request)

    def response_headers(self, request: LLMRequest, result: SchedulingResult) -> dict[str, str]:
        """The headers the ResponseHeader plugins add to the client's response, in plugin order
        (a later plugin's value for the same header wins)."""
        headers: dict[str, str] = {}
        for hook in self._headers:
            added = self._run(hook, hook.response_headers, request, result)
            if added:
                headers.update(added)
        return headers

    def response_first_token(self, request: LLMRequest, endpoint_name: str) -> None:
        for hook in self._first_token:
            self._run(hook, hook.response_first_token, request, endpoint_name)

    def response_usage(self, request: LLMRequest, prompt_tokens: int, completion_tokens: int) -> None:
        for hook in self._usage:
            self._run(hook, hook.response_usage, request, prompt_tokens, completion_tokens)

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        for hook in self._complete:
            self._run(hook, hook.response_complete, request, endpoint_name)

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
