"""The prefill-then-decode hand-off (P/D disaggregation), as llm-d's routing sidecar does it.

Orchestrated mode: a non-streaming prefill request (max_tokens 1, kv_transfer_params asking for
remote decode) goes to the prefill pod; the kv_transfer_params it returns go with the original
request to the decode pod, whose answer streams to the client. A failed prefill falls back to
decode-only (a request does not fail because its prefill did, as in llm-d) unless settings say
otherwise. Sidecar mode only names the prefill pod in `x-prefiller-host-port`. Either way the
prefill target is a pod the scheduler chose from the datastore: a client can never name one (the
header is stripped on the way in)."""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from typing import Any

from scheduler import Endpoint, SchedulingResult
from serve_app.gateway.errors import GatewayError
from serve_app.gateway.forwarder import Forwarder, UpstreamUnavailable

PREFILLER_HEADER = "x-prefiller-host-port"
PD_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})  # other APIs are served decode-only


@dataclass(slots=True)
class HandOff:
    """What the P/D step did, for the response, the metrics and the debug trace."""

    decision: str  # "decode-only" | "pd" | "pd-fallback"
    prefill: Endpoint | None = None
    body: bytes | None = None  # the decode request's body when it changed
    headers: dict[str, str] = field(default_factory=dict)
    prefill_ms: float | None = None
    attempts: int = 0
    error: str | None = None
    kv_transfer_params: dict[str, Any] | None = None

    def trace(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "prefill": None if self.prefill is None else self.prefill.name,
            "prefill_ms": None if self.prefill_ms is None else round(self.prefill_ms, 2),
            "prefill_attempts": self.attempts,
            "prefill_error": self.error,
            "kv_transfer_params": self.kv_transfer_params,
        }


def prefill_target(result: SchedulingResult) -> Endpoint | None:
    name = result.prefill_profile_name
    if name is None or name == result.primary_profile_name:
        return None
    prefill = result.profile_results.get(name)
    if prefill is None or not prefill.target_endpoints:
        return None
    return prefill.target_endpoints[0]


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill step's request: the same prompt, one token, no stream, remote decode asked."""
    out = copy.copy(body)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out.pop("stream_options", None)
    out["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    return out


async def hand_off(
    forwarder: Forwarder,
    result: SchedulingResult,
    body: dict[str, Any],
    path: str,
    headers: dict[str, str],
    mode: str,
    retries: int,
    on_failure: str,
) -> HandOff:
    prefill = prefill_target(result)
    if prefill is None:
        return HandOff("decode-only")
    if mode == "sidecar":
        return HandOff("pd", prefill, headers={PREFILLER_HEADER: prefill.host_port})
    payload = prefill_body(body)
    started = time.perf_counter()
    error = ""
    for attempt in range(1, retries + 2):
        try:
            answer = await forwarder.post_json(prefill, path, payload, headers)
            params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
            if not isinstance(params, dict):
                raise UpstreamUnavailable(f"{prefill.name} returned no kv_transfer_params")
        except UpstreamUnavailable as err:
            error = str(err)
            continue
        decode = dict(body)
        decode["kv_transfer_params"] = params
        return HandOff(
            "pd",
            prefill,
            body=json.dumps(decode).encode(),
            prefill_ms=(time.perf_counter() - started) * 1000,
            attempts=attempt,
            kv_transfer_params=params,
        )
    if on_failure == "fail":
        raise GatewayError(502, f"the prefill step failed on {prefill.name}: {error}", code="PrefillFailed")
    return HandOff(
        "pd-fallback", prefill, prefill_ms=(time.perf_counter() - started) * 1000, attempts=retries + 1, error=error
    )
