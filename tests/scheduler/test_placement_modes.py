"""Who decides is a mode of the placement (scheduler/config/placement.py `DecideIn`): with
`decide_in_replica` the gateway replica runs what a profile actor would, except what only an actor
can serve. The tables of docs/DESIGN.md that show it are compared with what the build computes."""

from __future__ import annotations

import re
from pathlib import Path

from scheduler.config import DecideIn, Placement, build_for, build_plugins, load_config_file
from scheduler.config.placement import ROLE_PLACEMENT, role_places

ROOT = Path(__file__).resolve().parents[2]
DESIGN = (ROOT / "docs" / "DESIGN.md").read_text()
SHIPPED = sorted(p.stem for p in (ROOT / "ray_epp" / "configs").glob("*.yaml"))
PRECISE = "bench/configs/precise.yaml"
GATEWAY, ACTOR = Placement.GATEWAY, Placement.PROFILE_ACTOR


def doc_table(name: str) -> list[list[str]]:
    """The rows of a table of DESIGN.md between its marker comments, header and rule left out."""
    found = re.search(rf"<!-- {name} table:.*?-->\n(.*?)<!-- end of {name} table -->", DESIGN, re.S)
    assert found, f"docs/DESIGN.md lost its {name} table"
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in found.group(1).splitlines()]
    return rows[2:]


def places(where: frozenset[Placement]) -> str:
    return ", ".join(p.value for p in Placement if p in where)


def test_the_role_table_is_what_role_places_computes():
    expected = [
        [role.__name__, places(role_places(role)), places(role_places(role, DecideIn.REPLICA))]
        for role in ROLE_PLACEMENT
    ]
    assert doc_table("role-placement") == expected


def in_replica_verdict(config: str) -> str:
    built = build_plugins(load_config_file(config), decide_in=DecideIn.REPLICA)
    need = built.needs_actor()
    if not need:
        assert built.profiles_in_actors() == []
        return "no profile actor"
    assert built.profiles_in_actors(), "a plugin placed in an actor belongs to some profile"
    return "refused: " + "; ".join(f"{name} {why}" for name, why in need.items())


def test_the_in_replica_configs_table_is_what_the_build_computes():
    rows = doc_table("in-replica configs")
    names = [row[0].strip("`") for row in rows]
    assert names == [*SHIPPED, PRECISE], "one row per shipped config, then the refused example"
    for name, (_, verdict) in zip(names, rows, strict=True):
        assert verdict == in_replica_verdict(str(ROOT / name) if "/" in name else name), name


def test_deciding_in_the_replica_moves_the_profiles_plugins_into_it():
    cfg = load_config_file("default")
    by_actors = build_plugins(cfg)
    in_replica = build_plugins(cfg, decide_in=DecideIn.REPLICA)
    assert by_actors.profiles_in_actors() == ["default"]
    assert in_replica.profiles_in_actors() == [] and in_replica.needs_actor() == {}
    for name, where in by_actors.placement.items():
        moved = (where - {ACTOR}) | {GATEWAY} if ACTOR in where else where
        assert in_replica.placement[name] == moved, name
    gateway = {p.name for p in build_for(cfg, GATEWAY, decide_in=DecideIn.REPLICA).plugins}
    assert gateway == {p.name for p in in_replica.profiles["default"].plugins()} | {
        p.name for p in build_for(cfg, GATEWAY).plugins
    }


def test_a_kv_event_sink_keeps_its_actor_and_so_does_what_it_looks_up():
    """The precise producer stays in the actor (only actors subscribe to the event streams); the
    scorer that reads it moves to the replica, so the profile would need both: refused."""
    built = build_plugins(load_config_file(str(ROOT / PRECISE)), decide_in=DecideIn.REPLICA)
    assert ACTOR in built.placement["precise-prefix-cache-producer"]
    assert built.placement["prefix-cache-scorer"] == {GATEWAY, Placement.ROUTER}
    assert list(built.needs_actor()) == ["precise-prefix-cache-producer"]
    assert "KV events" in built.needs_actor()["precise-prefix-cache-producer"]
    assert built.profiles_in_actors() == ["default"]


def test_validate_says_whether_the_replica_can_decide():
    from scheduler.config.report import config_report_file

    def verdict(config: str) -> tuple[str, str]:
        [line] = [x for x in config_report_file(config).lines if x.where == "gateway setting decide_in_replica"]
        return line.status, line.why

    assert verdict("default") == ("accepted", "the gateway replica runs every profile, no profile actor")
    status, why = verdict(str(ROOT / PRECISE))
    assert status == "refused" and why.startswith("needs the profile actors: precise-prefix-cache-producer reads")
