"""One dispatched request from its decision to its end, as both front doors see it (the HTTP
gateway, which relays the response itself, and the ext_proc service, which sees it pass through
Envoy): the same calls, in the same order, tell the plugins and the metrics what happened.

* the running-requests gauge goes up when the response starts and down when it ends;
* a streamed answer's first chunk is its first token (`ResponseFirstToken`);
* a whole answer's `usage` (a JSON body, or the stream's last usage event; an Anthropic stream's
  `message_start` and last `message_delta` together) goes to the
  `ResponseUsage` plugins, when one is configured, and to the token metrics;
* `close()`, once however the exchange ends (finished, failed, cancelled), is `ResponseComplete`:
  in-flight ledgers never keep an entry for a request that has gone.

What the metrics make of it (sizes, TTFT, gaps between chunks, tokens): serve_app/gateway/request_metrics.py."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scheduler import LLMRequest
from serve_app.gateway.request_metrics import RequestMetrics
from serve_app.gateway.tracing import RequestSpans, current_spans
from serve_app.gateway.usage import STREAM_HEAD_BYTES, STREAM_TAIL_BYTES, usage_counts_of_body, usage_counts_of_stream

if TYPE_CHECKING:
    from serve_app.gateway.core import GatewayCore


@dataclass(slots=True)
class Exchange:
    core: GatewayCore
    request: LLMRequest
    endpoint: str  # the name of the endpoint that serves the request
    started: float  # perf_counter() when the request arrived at the door
    streaming: bool  # a server-sent-event stream (the client asked for one and the answer is 200)
    metrics: RequestMetrics | None = None
    usage: tuple[int, int, int] | None = None  # prompt, completion, cached tokens (-1: not said)
    _first: bool = True
    _kept: list[bytes] = field(default_factory=list)  # the body (or the stream's tail) for usage
    _kept_bytes: int = 0
    _head: bytes = b""  # a stream's start (an Anthropic stream's usage begins there)
    _closed: bool = False
    spans: RequestSpans | None = None  # the request's trace (serve_app/gateway/tracing.py), when traced

    @classmethod
    def open(cls, core: GatewayCore, request: LLMRequest, endpoint: str, started: float, streaming: bool) -> Exchange:
        ex = cls(core, request, endpoint, started, streaming)
        ex.metrics = core.metrics.response_started(request, streaming, started)
        if getattr(core, "tracing", None) is not None:
            ex.spans = current_spans()
        return ex

    def chunk(self, data: bytes) -> None:
        """A piece of the response went by on its way to the client."""
        if not data:
            return
        arrived = self.core.metrics.chunk(self.metrics, len(data))  # type: ignore[arg-type]
        if self.spans is not None:
            self.spans.chunk()  # the first: the forward span's first_token event
        if self.streaming and self._first:
            self._first = False
            self.core.tell_first_token(self.request, self.endpoint)
        self._kept.append(data)
        self._kept_bytes += len(data)
        if self.streaming and len(self._head) < STREAM_HEAD_BYTES:
            self._head += data[: STREAM_HEAD_BYTES - len(self._head)]
        if self.streaming and self._kept_bytes > 2 * STREAM_TAIL_BYTES:  # only a stream's end is read
            tail = b"".join(self._kept)[-STREAM_TAIL_BYTES:]
            self._kept, self._kept_bytes = [tail], len(tail)
        if self.streaming:
            self.metrics.work_s += time.perf_counter() - arrived  # type: ignore[union-attr]

    def end(self, ok: bool) -> None:
        """The response arrived whole; `ok`: with status 200 (only then is its usage read). Before
        `close()`, so a fairness queue learns the cost before the completion frees room."""
        if not (ok and self._kept):
            return
        data = b"".join(self._kept)
        self._kept = []
        if self.streaming:
            usage = usage_counts_of_stream(data[-STREAM_TAIL_BYTES:], self._head)
        else:
            usage = usage_counts_of_body(data)
        self.usage = usage
        if usage is not None and self.core.wants_usage:
            self.core.lifecycle.response_usage(self.request, usage[0], usage[1])

    def close(self) -> None:
        """The exchange is over, however it ended: ResponseComplete, metrics. Runs once."""
        if self._closed:
            return
        self._closed = True
        self.core.metrics.finished(self.metrics, self.usage)  # type: ignore[arg-type]
        self.core.tell_complete(self.request, self.endpoint)
        if self.spans is not None and self.streaming:  # a whole body's request ends at the door
            self.spans.finish(200)
