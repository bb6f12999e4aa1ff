"""The whole KV-event path on a real Ray: a simulated pod's engine publishes vLLM KV events over
ZMQ on 127.0.0.1, the profile actor subscribes because the pod is in its pool, its precise prefix
producer indexes the blocks, and a request goes to the pod that holds them; the pod's stream state
is visible; a removed pod's subscription stops and its entry is forgotten."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.ray

ray = pytest.importorskip("ray")

from actors import PodSpec, ProfileCall, start_epp_actors, stop_epp_actors  # noqa: E402
from actors.protocol import ProfileEvent  # noqa: E402
from bench.tokenizer_fixture import make_tokenizer  # noqa: E402
from ray_epp.kvevents import BlockStored, KVEventBatch, ZmqEventPublisher  # noqa: E402
from scheduler import CycleState, LLMRequest, SchedulingResult  # noqa: E402
from scheduler.lifecycle import LifecycleEvent  # noqa: E402
from scheduler.plugins.support.tokenizer_backends import LocalTokenizer  # noqa: E402
from tests.actors.support import MODEL, fast_options, wait_for  # noqa: E402

BS = 16
PROMPT = "You are a helpful assistant. Answer the question about the document below. " * 12

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters: {{local: {{tokenizerPath: "{path}"}}}}
- type: precise-prefix-cache-producer
  parameters: {{tokenProcessorConfig: {{blockSize: {bs}}}}}
- type: prefix-cache-scorer
  parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
  - pluginRef: max-score-picker
"""


def pod_specs(sim, publishing: str, pub: ZmqEventPublisher) -> list[PodSpec]:
    """The simulated pods, `publishing`'s KV events at `pub` (the others at llm-d's default port)."""
    pods = []
    for p in sim.pods:
        spec = {"name": p.name, "address": p.address, "port": p.port, "labels": p.labels}
        if p.name == publishing:
            spec["kvEvents"] = {"endpoint": pub.endpoint, "replay": pub.replay_endpoint}
        pods.append(PodSpec(**spec))
    return pods


def three_picks(actor, tag: str) -> list[str]:
    """Where the profile actor sends three requests for the prompt and a question."""
    body = {"model": MODEL, "prompt": PROMPT + " and one more question?"}
    calls = [ProfileCall(LLMRequest(request_id=f"{tag}{i}", target_model=MODEL, body=body), CycleState())
             for i in range(3)]  # fmt: skip
    return [o.result.target_endpoints[0].name for o in ray.get(actor.run_batch.remote(calls))]


def test_events_from_a_pod_reach_the_profile_actor_and_route_its_requests(ray_session, sim, tmp_path):
    path = make_tokenizer(tmp_path)
    ids = LocalTokenizer(path).encode(PROMPT, True)
    n = len(ids) // BS
    with ZmqEventPublisher() as pub:
        pods = pod_specs(sim, "sim-1", pub)
        # The first half is published before anyone subscribes: lost to the subscriber, it is
        # recovered through the replay socket once the second half's sequence number shows the gap.
        half = n // 2
        pub.publish(KVEventBatch(0.0, [BlockStored(list(range(half)), None, ids[: half * BS], BS)]))
        epp = start_epp_actors(CONFIG.format(path=path, bs=BS), pods, options=fast_options("t-kv"))
        try:
            actor = epp.profiles["default"]
            wait_for(lambda: "sim-1" in ray.get(actor.kv_events.remote())["streams"], what="sim-1 subscribed")
            rest = BlockStored(list(range(half, n)), half - 1, ids[half * BS : n * BS], BS)

            def indexed():
                pub.publish(KVEventBatch(1.0, [rest]))  # again until the subscriber has joined
                info = ray.get(actor.kv_events.remote())
                pod = info["sinks"]["precise-prefix-cache-producer"]["pods"].get("sim-1")
                return info if pod and pod["status"] == "live" and pod["blocks"] == n else None

            info = wait_for(indexed, timeout=10, interval=0.2, what="sim-1's blocks in the profile actor's index")
            assert info["streams"]["sim-1"]["endpoint"] == pub.endpoint
            assert info["streams"]["sim-1"]["replayed"] >= 1
            assert ray.get(actor.info.remote())["kv_events"]["sim-1"] == "live"
            assert three_picks(actor, "k") == ["sim-1"] * 3

            ray.get(epp.datastore.remove_pod.remote("sim-1"))

            def forgotten():
                info = ray.get(actor.kv_events.remote())
                return (
                    "sim-1" not in info["streams"]
                    and "sim-1" not in info["sinks"]["precise-prefix-cache-producer"]["pods"]
                )

            wait_for(forgotten, timeout=10, what="sim-1's subscription stopped and its entry forgotten")
        finally:
            stop_epp_actors(epp)


def test_llm_d_precise_sample_with_its_data_layer_runs_on_the_actors(ray_session, sim):
    """llm-d's deploy/config/epp-precise-prefix-cache-config.yaml as written, with the model and
    tokenizer URL it asks to set: its data layer loads (the metrics actors scrape
    as its metrics source says, the profile actor follows the pods' KV events as its
    endpoint-notification source says), and requests go to the pod whose events hold the prompt."""
    from pathlib import Path

    from ray_epp.simulator.tokens import token_ids

    sample = Path(__file__).parents[1] / "fixtures" / "llm-d" / "epp-precise-prefix-cache-config.yaml"
    # the two values the sample asks to set: the model and its server (a simulated pod's /tokenize)
    config = sample.read_text().replace("http://localhost:8000", sim.pods[0].url).replace("hf-repo/model-name", MODEL)
    bs = 64
    ids = token_ids(PROMPT)  # what a simulated pod's /tokenize answers
    n = len(ids) // bs
    with ZmqEventPublisher() as pub:
        pods = pod_specs(sim, "sim-2", pub)
        epp = start_epp_actors(config, pods, options=fast_options("t-kv-llmd"))
        try:
            actor = epp.profiles["default"]
            stored = BlockStored(list(range(n)), None, ids[: n * bs], bs)

            def indexed():
                pub.publish(KVEventBatch(0.0, [stored]))  # again until the subscriber has joined
                info = ray.get(actor.kv_events.remote())
                pod = info["sinks"]["precise-prefix-cache-producer"]["pods"].get("sim-2")
                return pod if pod and pod["status"] == "live" and pod["blocks"] == n else None

            wait_for(indexed, timeout=10, interval=0.2, what="sim-2's blocks in the profile actor's index")
            assert three_picks(actor, "l") == ["sim-2"] * 3
            assert ray.get(actor.kv_events.remote())["sinks"]["precise-prefix-cache-producer"]["scored"]["precise"]
        finally:
            stop_epp_actors(epp)


def test_speculative_indexing_on_the_actors_sends_a_repeat_where_its_prefix_was_just_sent(ray_session, sim, tmp_path):
    """llm-d's `speculativeIndexing`: every pod is live and none has published a block, yet once the
    gateway tells the profile actor its decision (the PreRequest event, a fresh copy of the request
    as the gateway sends it), the repeats of that prompt follow it to the same pod."""
    path = make_tokenizer(tmp_path)
    config = CONFIG.format(path=path, bs=BS).replace(
        "{tokenProcessorConfig: {blockSize: 16}}", "{tokenProcessorConfig: {blockSize: 16}, speculativeIndexing: true, "
        "speculativeTTL: 60s}"
    )
    assert "speculativeIndexing" in config
    pubs = {p.name: ZmqEventPublisher() for p in sim.pods}
    try:
        pods = [
            PodSpec(name=p.name, address=p.address, port=p.port, labels=p.labels,
                    kvEvents={"endpoint": pubs[p.name].endpoint, "replay": pubs[p.name].replay_endpoint})
            for p in sim.pods
        ]  # fmt: skip
        epp = start_epp_actors(config, pods, options=fast_options("t-kv-spec"))
        try:
            actor = epp.profiles["default"]

            def all_live():
                for pub in pubs.values():
                    pub.publish(KVEventBatch(0.0, []))
                pods = ray.get(actor.kv_events.remote())["sinks"]["precise-prefix-cache-producer"]["pods"]
                return len(pods) == len(pubs) and {pod["status"] for pod in pods.values()} == {"live"}

            wait_for(all_live, timeout=10, interval=0.2, what="every pod's events live")
            body = {"model": MODEL, "prompt": PROMPT + " and one more question?"}
            first = LLMRequest(request_id="s0", target_model=MODEL, body=body)
            [outcome] = ray.get(actor.run_batch.remote([ProfileCall(first, CycleState())]))
            chosen = outcome.result.target_endpoints[0].name
            decision = SchedulingResult({"default": outcome.result}, "default")
            sent = first.with_body_fields(body)  # a fresh copy, as the gateway sends it
            ray.get(actor.run_batch.remote([ProfileEvent(LifecycleEvent.PRE_REQUEST, sent, result=decision)]))
            sink = ray.get(actor.kv_events.remote())["sinks"]["precise-prefix-cache-producer"]
            assert sink["speculative"]["requests"] == 1 and sink["speculative"]["entries"] > 0, sink
            assert all(pod["blocks"] == 0 for pod in sink["pods"].values())  # nothing confirmed
            assert three_picks(actor, "sp") == [chosen] * 3
        finally:
            stop_epp_actors(epp)
    finally:
        for pub in pubs.values():
            pub.close()
