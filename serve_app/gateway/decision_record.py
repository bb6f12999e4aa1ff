"""Why a request went where it went, asked after the fact: a gateway replica keeps the decision of
a sampled share of its requests (`decision_record_ratio`) and sends them to the gateway's decision
log (actors/decision_log.py), where GET /admin/decisions and `epp explain` find them.

A record is the scheduling trace a debug request gets in `x-epp-trace` (scheduler/trace.py: per
profile, what each filter kept and removed, each scorer's raw score per endpoint and its weight,
the weighted totals, the pick), with the request id, the model, the outcome and the replica. A
sampled request's profile actors build that trace as they run (the request asks for it as a debug
request does); the weighted scores and the winner's margin are worked out only when a record is
read (`explained`). Sampling is by the request id's hash, so a retried request's attempts are all
kept or none, and a request not sampled costs one hash."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections import deque
from typing import Any

from actors.decision_log import MAX_DECISIONS_PER_ID, DecisionRing

log = logging.getLogger("ray_epp.gateway.decisions")

FLUSH_INTERVAL_S = 0.2  # a record reaches the shared log at most this long after its decision
LOG_TIMEOUT_S = 10.0


class DecisionRecorder:
    """One replica's part of the decision record. `log`: the DecisionLog actor (None: records
    stay in this replica, the last `size`)."""

    def __init__(self, ratio: float, size: int, log_actor: Any, source: str) -> None:
        self.ratio, self.size, self.source = ratio, size, source
        self._threshold = int(ratio * 2**32)  # crc32 of the id below this: sampled
        self._log = log_actor
        # without a log: this replica's ring; with one: what is not sent yet (bounded the same)
        self._local = DecisionRing(size)
        self._unsent: deque[dict[str, Any]] = deque(maxlen=size * MAX_DECISIONS_PER_ID)
        self._task: asyncio.Task | None = None

    def samples(self, request_id: str) -> bool:
        return zlib.crc32(request_id.encode()) < self._threshold

    def record(self, request: Any, result: Any, trace: Any, error: Any = None) -> None:
        """Keep one decision (`result`), or the failure to decide (`error`, a SchedulingError)."""
        target = result.target if result is not None else None
        entry = {
            "request_id": request.request_id,
            "at": time.time(),
            "model": request.target_model,
            "gateway": self.source,
            "outcome": "scheduled" if error is None else "failed",
            "error": None if error is None else f"{error.code.value}: {error.message}",
            "target": target.name if target is not None else None,
            "address": target.host_port if target is not None else None,
            "primary_profile": result.primary_profile_name if result is not None else None,
            "prefill_profile": result.prefill_profile_name if result is not None else None,
            "excluded": sorted(request.excluded_endpoints),
            "trace": _snapshot(trace),
        }
        if self._log is None:
            self._local.add(entry)
        else:
            self._unsent.append(entry)

    # ---- the shared log -------------------------------------------------------------------------
    def start(self) -> None:
        if self._log is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._send_loop())

    async def flush(self) -> None:
        if not self._unsent:
            return
        batch = list(self._unsent)
        self._unsent.clear()
        try:
            await asyncio.wait_for(self._log.add.remote(batch, self.size), LOG_TIMEOUT_S)
        except Exception as err:  # the log restarting or gone: these records are lost, not the requests
            log.warning("decision log: %d records not kept: %s", len(batch), err)

    async def _send_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            with contextlib.suppress(Exception):
                await self.flush()

    # ---- reading --------------------------------------------------------------------------------
    async def lookup(self, request_id: str) -> list[dict[str, Any]]:
        """Every decision kept for `request_id`, oldest first (this replica's unsent ones too)."""
        if self._log is None:
            return self._local.get(request_id)
        await self.flush()
        return await asyncio.wait_for(self._log.get.remote(request_id), LOG_TIMEOUT_S)

    async def recent(self, limit: int) -> dict[str, Any]:
        if self._log is None:
            return {"decisions": self._local.recent(limit), "kept": len(self._local), "capacity": self.size}
        await self.flush()
        return await asyncio.wait_for(self._log.recent.remote(limit), LOG_TIMEOUT_S)


def _snapshot(trace: Any) -> dict[str, Any]:
    """The trace as it is now: a debug request's retry reuses its trace and replaces its profiles."""
    out = trace.to_json()
    out["profiles"] = dict(out["profiles"])
    out["rounds"] = list(out["rounds"])
    return out


def explained(record: dict[str, Any]) -> dict[str, Any]:
    """A record with, per profile, each scorer's weighted score per endpoint (its raw score clamped
    to [0, 1] times its weight, as the profile sums them), the endpoints ranked by total, and the
    pick's margin over the best other endpoint (None with a single candidate)."""
    out = dict(record)
    profiles = {}
    for name, profile in record["trace"].get("profiles", {}).items():
        totals: dict[str, float] = profile.get("totals", {})
        scorers = [
            {**s, "weighted": {ep: round(min(max(v, 0.0), 1.0) * s["weight"], 6) for ep, v in s["scores"].items()}}
            for s in profile.get("scorers", [])
        ]
        ranking = sorted(totals, key=lambda ep: -totals[ep])
        picked = profile.get("picked") or []
        winner = picked[0] if picked else None
        others = [ep for ep in ranking if ep != winner]
        margin = None
        if winner in totals and others:
            margin = {"over": others[0], "by": round(totals[winner] - totals[others[0]], 6)}
        profiles[name] = {**profile, "scorers": scorers, "ranking": ranking, "winner": winner, "margin": margin}
    out["profiles"] = profiles
    return out
