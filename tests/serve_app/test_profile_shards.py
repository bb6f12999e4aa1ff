"""Profile shards (`profile_shards`) through a real gateway: two shards of a profile with a prefix
index, simulated vLLM pods on 127.0.0.1 (test_metrics_e2e.py's deployment, started once for
both). A prefix always reaches the same shard and sticks to one pod, different prefixes spread
over the shards, the events reach the deciding shard, and a killed shard comes back while the
other keeps serving (after the other modules of that deployment)."""

from __future__ import annotations

import threading
import time

import pytest

from scheduler import LLMRequest
from serve_app.gateway.shard_key import PROFILE_SHARD, ShardKey
from tests.serve_app import test_metrics_e2e
from tests.serve_app.deployments import wait_until

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
E2E_SETUP = test_metrics_e2e.E2E_SETUP
SHARDS = E2E_SETUP.spec["profile_shards"]


def prompt(prefix: int, question: int) -> str:
    return f"Conversation {prefix}: you are a meticulous assistant. " * 40 + f"Q{question}"


def shard_of(text: str) -> int:
    return ShardKey(SHARDS).shard_of(LLMRequest("r", MODEL, {"model": MODEL, "prompt": text}))


def prefixes_on(shard: int, count: int) -> list[int]:
    return [p for p in range(200) if shard_of(prompt(p, 0)) == shard][:count]


# ---- the key, without Ray -------------------------------------------------------------------


def test_the_key_follows_the_first_block():
    key = ShardKey(8)
    a = LLMRequest("a", MODEL, {"prompt": "x" * 64 + "one tail"})
    b = LLMRequest("b", MODEL, {"prompt": "x" * 64 + "another, longer tail"})
    c = LLMRequest("c", MODEL, {"prompt": "y" * 64 + "one tail"})
    other_model = LLMRequest("d", "other-model", {"prompt": "x" * 64 + "one tail"})
    assert key.key(a) == key.key(b)  # the same first block (16 tokens = 64 chars)
    assert key.key(a) != key.key(c)
    assert key.key(a) != key.key(other_model)  # as the prefix index: another model never matches
    assert len({ShardKey(4).shard_of(LLMRequest(str(i), MODEL, {"prompt": f"{i:04d}" * 20})) for i in range(64)}) == 4


def test_the_session_header_is_the_key_when_present():
    key = ShardKey(16, session_header="x-session-id")
    one = LLMRequest("a", MODEL, {"prompt": "a" * 100}, {"X-Session-Id": "s1"})
    two = LLMRequest("b", MODEL, {"prompt": "b" * 100}, {"x-session-id": "s1"})
    bare = LLMRequest("c", MODEL, {"prompt": "b" * 100})
    assert key.key(one) == key.key(two)
    assert key.key(bare) == ShardKey(16).key(bare)


def test_one_shard_is_always_shard_0_and_the_shard_is_memoised():
    req = LLMRequest("a", MODEL, {"prompt": "z" * 300})
    assert ShardKey(1).shard_of(req) == 0 and PROFILE_SHARD not in req.derived
    shard = ShardKey(7).shard_of(req)
    req.body = {}  # the response events carry no body: the memo keeps the deciding shard
    assert ShardKey(7).shard_of(req) == shard


def test_profiles_must_have_the_same_number_of_shards():
    from serve_app.gateway.ray_runner import RayProfileRunner

    with pytest.raises(ValueError, match="same number of shards"):
        RayProfileRunner({"prefill": [object(), object()], "decode": [object()]}, ())


# ---- through the gateway ---------------------------------------------------------------------


def shard_infos(gateway) -> list[dict]:
    import ray

    return ray.get([a.info.remote() for a in gateway.actors.shards["default"]], timeout=30)


def send(client, text: str, sim) -> str:
    resp = client.post("/v1/completions", json={"model": MODEL, "prompt": text, "max_tokens": 2})
    assert resp.status_code == 200, resp.text
    host_port = resp.headers["x-gateway-destination-endpoint"]
    return next(p.name for p in sim.pods if host_port.endswith(f":{p.port}"))




@pytest.mark.ray
def test_the_launch_starts_named_shards(gateway):
    from actors.launcher import profile_actor_name

    assert len(gateway.actors.shards["default"]) == SHARDS
    assert gateway.actors.profiles["default"] is gateway.actors.shards["default"][0]
    names = [profile_actor_name(gateway.actors.datastore_name, "default", i) for i in range(SHARDS)]
    assert names[0] == f"{gateway.actors.datastore_name}:profile:default"  # shard 0: the unsharded name
    assert all(info["profile"] == "default" and info["endpoints"] for info in shard_infos(gateway))


@pytest.mark.ray
def test_a_prefix_always_reaches_one_shard_and_sticks_to_one_pod(client, gateway, sim):
    for shard in range(SHARDS):
        for prefix in prefixes_on(shard, 2):
            before = [i["calls"] for i in shard_infos(gateway)]
            home = send(client, prompt(prefix, 0), sim)
            time.sleep(0.2)  # the decision reaches the shard's prefix index
            later = [send(client, prompt(prefix, q), sim) for q in range(1, 5)]
            grown = [i["calls"] - b for i, b in zip(shard_infos(gateway), before, strict=True)]
            assert grown[shard] == 5 and sum(grown) == 5, (prefix, grown)
            assert later == [home] * 4, (prefix, home, later)


@pytest.mark.ray
def test_different_prefixes_spread_and_events_reach_the_deciding_shard(client, gateway, sim):
    before = shard_infos(gateway)
    for prefix in range(300, 320):
        send(client, prompt(prefix, 0), sim)
    expected = [sum(shard_of(prompt(p, 0)) == s for p in range(300, 320)) for s in range(SHARDS)]
    assert all(expected), expected  # the 20 prefixes do fall on both shards

    def grown():
        after = shard_infos(gateway)
        out = []
        for a, b in zip(after, before, strict=True):
            out.append({k: a["events"][k] - b["events"][k] for k in a["events"]} | {"calls": a["calls"] - b["calls"]})
        done = all(g["response_complete"] == g["calls"] for g in out)
        return out if done else None

    counts = wait_until(grown)
    for shard, got in enumerate(counts):
        assert got["calls"] == expected[shard]
        assert got["pre_request"] == got["response_complete"] == expected[shard], counts


@pytest.mark.ray
@pytest.mark.spends_e2e_setup  # the deployment's other modules see no restarted shard
def test_a_killed_shard_restarts_and_the_other_keeps_serving(client, gateway, sim):
    import httpx
    import ray

    survivor, victim = 0, 1
    [alive_prefix] = prefixes_on(survivor, 1)
    [killed_prefix] = prefixes_on(victim, 1)
    send(client, prompt(killed_prefix, 0), sim)
    assert shard_infos(gateway)[victim]["calls"] > 0
    survivor_calls = shard_infos(gateway)[survivor]["calls"]

    ray.kill(gateway.actors.shards["default"][victim], no_restart=False)
    waiting: list[int] = []

    def through_the_killed_shard():
        with httpx.Client(base_url=gateway.url, timeout=60) as c:
            body = {"model": MODEL, "prompt": prompt(killed_prefix, 1), "max_tokens": 2}
            waiting.append(c.post("/v1/completions", json=body).status_code)

    thread = threading.Thread(target=through_the_killed_shard)
    thread.start()
    served = [send(client, prompt(alive_prefix, q), sim) for q in range(10)]  # meanwhile, the other shard
    thread.join(60)
    assert len(served) == 10
    assert waiting == [200]  # held while its shard restarted, then served
    infos = wait_until(lambda: (i := shard_infos(gateway)) and i[victim]["version"] > 0 and i)
    assert infos[victim]["calls"] <= 2  # a new incarnation: its count started again
    assert infos[survivor]["calls"] >= survivor_calls + 10  # the survivor was not restarted
