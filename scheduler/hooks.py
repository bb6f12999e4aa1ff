"""The request-lifecycle hooks of a set of plugins, called in one place: PreRequest after the
decision, ResponseFirstToken when a stream's first token arrives, ResponseComplete at the end.
The in-process Scheduler uses it for all its plugins, the gateway for the ones it keeps locally."""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.interfaces import Plugin, PreRequest, ResponseComplete, ResponseFirstToken
from scheduler.types import LLMRequest, SchedulingResult


class RequestHooks:
    __slots__ = ("_complete", "_first_token", "_pre_request")

    def __init__(self, plugins: Iterable[Plugin]) -> None:
        plugins = list(plugins)
        self._pre_request = [p for p in plugins if isinstance(p, PreRequest)]
        self._first_token = [p for p in plugins if isinstance(p, ResponseFirstToken)]
        self._complete = [p for p in plugins if isinstance(p, ResponseComplete)]

    def __bool__(self) -> bool:
        return bool(self._pre_request or self._first_token or self._complete)

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        for hook in self._pre_request:
            hook.pre_request(request, result)

    def response_first_token(self, request: LLMRequest, endpoint_name: str) -> None:
        for hook in self._first_token:
            hook.response_first_token(request, endpoint_name)

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        for hook in self._complete:
            hook.response_complete(request, endpoint_name)
