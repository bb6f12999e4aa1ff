"""The joint placement of one burst window (llm-d's burst prefix producer, pkg/epp/framework/plugins/
requestcontrol/dataproducer/burstprefix/assign.go at ebab6879): requests that arrived together and
share a prompt are steered to the same replica(s), so the shared prefix is prefilled once instead of
on every replica's cold cache.

Requests with an identical block-hash chain form a group; a group of two or more is always a
placement unit, a lone request only when `min_colocate_blocks > 0` and it shares that many leading
blocks with another request of the window. Groups are placed before lone requests, longest prefix
first. A unit fills one replica up to `k` (-1: no cap) and spills to the next least batch-loaded
one; its first replica prefers one already holding >= `min_colocate_blocks` of its leading blocks
while that replica is under its fair share of the window. Load is counted in requests, or with
`by_tokens` in prefix blocks a replica must still prefill. Ties go to fewer running requests, then
the lower name. A request outside every unit keeps `assigned` None (no affinity)."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.types import Endpoint

UNLIMITED = -1


@dataclass(slots=True, eq=False)
class BurstEntry:
    """One request of a window: its prompt's block hashes (a chain: equal leading hashes mean an
    equal leading prefix), the replicas it may go to, and, once sealed, the one it is steered to."""

    hashes: list[int]
    endpoints: list[Endpoint]
    assigned: str | None = None


def assign(entries: list[BurstEntry], k: int, min_colocate_blocks: int, by_tokens: bool) -> None:
    """Set `assigned` on every entry that is part of a placement unit."""
    groups: dict[tuple[int, ...], list[BurstEntry]] = {}
    replicas: list[Endpoint] = []
    for e in entries:
        if not e.hashes:
            continue
        groups.setdefault(tuple(e.hashes), []).append(e)
        if not replicas:
            replicas = e.endpoints
    if not replicas:
        return
    shared = _shared_prefix_keys(groups, min_colocate_blocks)
    group_units = [key for key, members in groups.items() if len(members) >= 2]
    single_units = [key for key, members in groups.items() if len(members) == 1 and key in shared]
    if not group_units and not single_units:
        return
    # Longest prefix first (stable): it seeds the most blocks for shorter units to match.
    group_units.sort(key=len, reverse=True)
    single_units.sort(key=len, reverse=True)
    total = sum(len(key) if by_tokens else len(groups[key]) for key in group_units + single_units)
    max_share = -(-total // len(replicas))  # ceil: a replica's fair share of the window
    holders: dict[int, set[str]] = {}  # block hash -> replicas that will hold it after this window
    load: dict[str, int] = {}
    running = {ep.name: ep.metrics.running_requests_size for ep in replicas}
    for key in group_units + single_units:
        _place(groups[key], key, replicas, k, min_colocate_blocks, max_share, holders, load, running, by_tokens)


def _shared_prefix_keys(groups: dict[tuple[int, ...], list[BurstEntry]], n: int) -> set[tuple[int, ...]]:
    """Keys whose requests share at least `n` leading blocks with another request of the window."""
    if n <= 0:
        return set()
    count: dict[tuple[int, ...], int] = {}
    for key, members in groups.items():
        if len(key) >= n:
            count[key[:n]] = count.get(key[:n], 0) + len(members)
    return {key for key in groups if len(key) >= n and count[key[:n]] >= 2}


def _longest_prefix(key: tuple[int, ...], holders: dict[int, set[str]]) -> dict[str, int]:
    """Per replica, the leading blocks of `key` it already holds (a chain: holding block i means
    holding 0..i, so the walk stops at the first block nobody holds)."""
    matched: dict[str, int] = {}
    for h in key:
        who = holders.get(h)
        if not who:
            break
        for name in who:
            matched[name] = matched.get(name, 0) + 1
    return matched


def _place(
    members: list[BurstEntry],
    key: tuple[int, ...],
    replicas: list[Endpoint],
    k: int,
    min_colocate_blocks: int,
    max_share: int,
    holders: dict[int, set[str]],
    load: dict[str, int],
    running: dict[str, int],
    by_tokens: bool,
) -> None:
    prefer_match = min_colocate_blocks > 0
    matches = _longest_prefix(key, holders) if prefer_match or by_tokens else {}
    per_replica: dict[str, int] = {}
    i = 0
    while i < len(members):
        target = _pick(replicas, per_replica, k, load, running, matches, min_colocate_blocks, max_share, prefer_match)
        run = len(members) - i
        if k != UNLIMITED:
            run = min(run, max(1, k - per_replica.get(target, 0)))  # over k x replicas: one, then rebalance
        for m in members[i : i + run]:
            m.assigned = target
        first_touch = target not in per_replica
        per_replica[target] = per_replica.get(target, 0) + run
        if not by_tokens:
            load[target] = load.get(target, 0) + run
        elif first_touch:  # the prefix is prefilled once per replica, minus what it already holds
            load[target] = load.get(target, 0) + max(0, len(key) - matches.get(target, 0))
        i += run
        prefer_match = False  # only the unit's first replica gets the prefix preference
    for name in per_replica:
        for h in key:
            holders.setdefault(h, set()).add(name)


def _pick(
    replicas: list[Endpoint],
    per_replica: dict[str, int],
    k: int,
    load: dict[str, int],
    running: dict[str, int],
    matches: dict[str, int],
    min_colocate_blocks: int,
    max_share: int,
    prefer_match: bool,
) -> str:
    def rank(name: str) -> tuple[int, int, str]:
        return load.get(name, 0), running[name], name

    names = [ep.name for ep in replicas]
    open_ = [n for n in names if k == UNLIMITED or per_replica.get(n, 0) < k]
    if prefer_match:
        near = [
            n for n in open_ if load.get(n, 0) < max_share and matches.get(n, 0) >= min_colocate_blocks
        ]
        if near:  # the longest shared prefix, then the least loaded
            return min(near, key=lambda n: (-matches.get(n, 0), *rank(n)))
    return min(open_ or names, key=rank)
