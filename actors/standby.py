"""Where a profile actor's standby runs: the actor and its standby share a STRICT_SPREAD placement
group of two bundles, so Ray never puts them on one node, not when it places them first and not
when it places one again after its node died (the lost bundle waits for a node the other does not
hold). On a cluster of one node there is no standby (docs/DESIGN.md, "Profile standbys")."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, get_placement_group, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.options import ActorOptions
from actors.placement import PLACED_MIN_CPUS

log = logging.getLogger("ray_epp.actors.standby")


def standby_name(actor_name: str) -> str:
    return f"{actor_name}:standby"


def group_name(actor_name: str) -> str:
    return f"{actor_name}:pair"


def pair_bundle(opts: ActorOptions) -> dict[str, float]:
    return {"CPU": max(opts.profile_num_cpus, PLACED_MIN_CPUS)}


def hosts(rows: Iterable[Mapping[str, Any]], bundle: Mapping[str, float], labels: Mapping[str, str]) -> int:
    """How many alive nodes (`ray.nodes()` rows) could hold a bundle, carrying `labels`."""
    return sum(
        1
        for r in rows
        if r.get("Alive")
        and all(r.get("Resources", {}).get(k, 0) >= v for k, v in bundle.items())
        and all((r.get("Labels") or {}).get(k) == v for k, v in labels.items())
    )


def wants_standby(opts: ActorOptions, rows: Iterable[Mapping[str, Any]]) -> bool:
    """`profile_standby` "on", or "auto" with at least two alive nodes able to hold a profile actor."""
    if opts.profile_standby == "off":
        return False
    return opts.profile_standby == "on" or hosts(list(rows), pair_bundle(opts), {}) >= 2


def pair_group(actor_name: str, lifetime: str | None, opts: ActorOptions, timeout_s: float) -> PlacementGroup | None:
    """The placement group of an actor and its standby (reused by name, else created), or None
    when Ray can not place it within `timeout_s` (fewer than two nodes with room). The profile's
    node labels select the pair's nodes when at least two alive nodes carry them; else any."""
    name = group_name(actor_name)
    with contextlib.suppress(ValueError):
        return get_placement_group(name)
    bundle = pair_bundle(opts)
    labels = opts.profile_node_labels
    selector = [dict(labels), dict(labels)] if labels and hosts(ray.nodes(), bundle, labels) >= 2 else None
    group = placement_group(
        [bundle, bundle], strategy="STRICT_SPREAD", name=name, lifetime=lifetime, bundle_label_selector=selector
    )
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except Exception as err:
        remove_placement_group(group)
        log.warning("no standby for %s: Ray could not place it on a second node (%s)", actor_name, err)
        return None
    return group


def in_group(group: PlacementGroup, bundle: int) -> PlacementGroupSchedulingStrategy:
    """Bundle 0 holds the actor, bundle 1 its standby."""
    return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=bundle)


def remove_pair_group(actor_name: str) -> None:
    with contextlib.suppress(Exception):
        remove_placement_group(get_placement_group(group_name(actor_name)))
