"""The decision log: the last N scheduling decisions of every gateway replica, by request id, so an
operator can ask after the fact why a request went where it went (`epp explain`, GET
/admin/decisions; docs/OBSERVABILITY.md, "Why it went there").

One small named actor holds them for the whole gateway: a replica sends what it recorded in one
call every 0.2 s (serve_app/gateway/decision_record.py), and whichever replica answers the admin route
asks this actor, so the record is found whatever replica decided. Bounded: the request whose
records reached the log first leaves when a new one would make more than `capacity` (the
replicas' `decision_record_size`; two replicas' records of the same 0.2 s may reach it in either
order); a request id a client reuses keeps its last few decisions."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any

import ray

LOG_NAME = "epp-decision-log"
MAX_DECISIONS_PER_ID = 8  # a retried request's attempts, or a client that reuses one request id


class DecisionRing:
    """Records by request id, oldest first, at most `capacity` ids (each with its last few
    decisions). Plain dicts in, plain dicts out: they travel as JSON."""

    __slots__ = ("_by_id", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_id: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def add(self, record: dict[str, Any]) -> None:
        rid = record["request_id"]
        kept = self._by_id.pop(rid, None) or []
        kept.append(record)
        self._by_id[rid] = kept[-MAX_DECISIONS_PER_ID:]
        while len(self._by_id) > self.capacity:
            self._by_id.popitem(last=False)

    def get(self, request_id: str) -> list[dict[str, Any]]:
        return list(self._by_id.get(request_id, ()))

    def recent(self, limit: int) -> list[dict[str, Any]]:
        """The last decision of each of the `limit` newest request ids, newest first."""
        out = []
        for records in reversed(self._by_id.values()):
            if len(out) >= limit:
                break
            out.append(records[-1])
        return out

    def __len__(self) -> int:
        return len(self._by_id)


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class DecisionLog:
    """The gateway's shared DecisionRing (a restart loses the records, nothing else)."""

    def __init__(self, capacity: int = 1000) -> None:
        self._ring = DecisionRing(capacity)

    def add(self, records: list[dict[str, Any]], capacity: int) -> None:
        self._ring.capacity = capacity  # the replicas' setting (a redeploy may change it)
        for record in records:
            self._ring.add(record)

    def get(self, request_id: str) -> list[dict[str, Any]]:
        return self._ring.get(request_id)

    def recent(self, limit: int) -> dict[str, Any]:
        return {"decisions": self._ring.recent(limit), "kept": len(self._ring), "capacity": self._ring.capacity}


def get_or_create_decision_log(namespace: str | None = None) -> Any:
    """The named log; detached, so it does not die with whichever process created it first."""
    return DecisionLog.options(name=LOG_NAME, namespace=namespace, get_if_exists=True, lifetime="detached").remote()


def stop_decision_log(namespace: str | None = None) -> None:
    with contextlib.suppress(Exception):
        ray.kill(ray.get_actor(LOG_NAME, namespace=namespace), no_restart=True)
