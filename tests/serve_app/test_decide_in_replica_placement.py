"""A gateway replica that decides (`decide_in_replica`) runs exactly the plugins that the config's
placement puts in it in that mode (scheduler/config/placement.py `DecideIn.REPLICA`): its own, told
by its lifecycle, and the profiles', run by its local runner (with what they call). Built without Ray: the core starts
nothing until its first request."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler import dump_config, load_config_file
from scheduler.config import DecideIn, Placement, build_for
from serve_app.gateway.core import GatewayCore
from serve_app.gateway.local_runner import InReplicaUnsupported, LocalProfileRunner

SHIPPED = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "ray_epp" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("config", SHIPPED)
def test_the_replica_runs_what_the_placement_puts_in_it(config):
    cfg = load_config_file(config)
    core = GatewayCore(dump_config(cfg), {"decide_in_replica": True}, None, {}, None)
    assert isinstance(core.runner, LocalProfileRunner)
    placed = build_for(cfg, Placement.GATEWAY, decide_in=DecideIn.REPLICA)
    configured = set(placed.built.plugins)  # not admission's default detector, which no config names
    runs = {p.name for p in core.lifecycle.plugins} | {
        p.name for profile in core.runner.profiles.values() for p in profile.plugins()
    }
    todo = list(runs)
    while todo:  # and what they call (a decision tree's filters)
        for used in placed.built.uses.get(todo.pop(), ()):
            if used not in runs:
                runs.add(used)
                todo.append(used)
    assert runs & configured == {p.name for p in placed.plugins}


def test_a_serve_config_that_needs_the_profile_actors_is_refused_before_anything_starts(tmp_path):
    """`serve run serve_app.app:build_app` refuses as `epp up` does, before it places any actor."""
    from serve_app.app import build_app

    settings = tmp_path / "settings.yaml"
    settings.write_text("decide_in_replica: true\n")
    precise = str(Path(__file__).resolve().parents[2] / "bench" / "configs" / "precise.yaml")
    args = {"pods": str(tmp_path / "pods.yaml"), "settings": str(settings), "config": precise}
    with pytest.raises(InReplicaUnsupported, match=r"precise-prefix-cache-producer reads the pods' KV events"):
        build_app(args)
    with pytest.raises(InReplicaUnsupported, match="profile_shards is 2"):
        build_app({**args, "config": "default", "profile_shards": 2})


def test_the_local_runner_refuses_a_plugin_only_an_actor_can_run():
    """The replica's own guard, for a core built past the launcher's check."""
    from scheduler.config import build_plugins

    precise = Path(__file__).resolve().parents[2] / "bench" / "configs" / "precise.yaml"
    built = build_plugins(load_config_file(str(precise)))
    with pytest.raises(InReplicaUnsupported, match=r"precise-prefix-cache-producer reads the pods' KV events"):
        LocalProfileRunner(built.profiles, list)
