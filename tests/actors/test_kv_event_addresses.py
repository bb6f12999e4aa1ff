"""Where a pod publishes its KV events (its pods-file `kvEvents`, else llm-d's socketPort at its
address), and the profile actor's feeds without Ray: a real publisher on 127.0.0.1, a real
precise producer as the sink, subscriptions that follow the pool."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from actors import PodSpec
from actors.kv_event_feeds import KVEventFeeds, event_addresses
from actors.options import KV_EVENTS_LABEL, KV_REPLAY_LABEL
from ray_epp.kvevents import BlockStored, KVEventBatch, ZmqEventPublisher
from scheduler import Endpoint, Scheduler, load_config
from scheduler.interfaces import KVEventSink

CONFIG = """
plugins:
- type: precise-prefix-cache-producer
  parameters: {kvEventsConfig: {podDiscoveryConfig: {socketPort: 5599}}}
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
"""


def test_kv_events_of_a_pod_spec_become_its_endpoint_labels():
    spec = PodSpec(name="p", address="10.0.0.1", port=8000, labels={"a": "b"},
                   kvEvents={"endpoint": "tcp://10.0.0.1:5557", "replay": "tcp://10.0.0.1:5558"})  # fmt: skip
    assert spec.labels == {"a": "b", KV_EVENTS_LABEL: "tcp://10.0.0.1:5557", KV_REPLAY_LABEL: "tcp://10.0.0.1:5558"}
    ep = Endpoint("p", "10.0.0.1", 8000, dict(spec.labels))
    assert event_addresses(ep, 5599) == ("tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558")
    assert event_addresses(Endpoint("q", "10.0.0.2", 8000), 5599) == ("tcp://10.0.0.2:5599", None)


@pytest.mark.parametrize("bad", [{"replay": "tcp://x:1"}, "tcp://x:1", {"endpoint": "tcp://x:1", "port": 3}])
def test_a_bad_kv_events_field_is_an_error(bad):
    with pytest.raises(ValidationError, match="kvEvents"):
        PodSpec(name="p", address="10.0.0.1", port=8000, kvEvents=bad)


def test_feeds_follow_the_pool_and_deliver_in_order():
    sink = Scheduler.from_config(load_config(CONFIG)).hooks.having(KVEventSink)[0]
    feeds = KVEventFeeds([sink])
    assert feeds.port == 5599
    with ZmqEventPublisher() as pub:
        ep = Endpoint("p", "127.0.0.1", 8000, {KV_EVENTS_LABEL: pub.endpoint, KV_REPLAY_LABEL: pub.replay_endpoint})
        feeds.sync([ep])
        deadline = time.monotonic() + 5
        i = 0
        while sink.precise.pod_blocks("p") < 3 and time.monotonic() < deadline:
            tokens = list(range(16 * i, 16 * (i + 1)))
            pub.publish(KVEventBatch(0.0, [BlockStored([i], i - 1 if i else None, tokens, 16)]))
            i += 1
            time.sleep(0.05)
            feeds.drain()
        assert sink.precise.pod_blocks("p") >= 3 and sink.precise.status("p") == "live"
        assert feeds.statuses()["p"]["state"] == "live"
        feeds.sync([])  # the pod left: its subscription stops and the sink forgets it
        assert feeds.statuses() == {} and sink.precise.pod_blocks("p") == 0 and sink.info()["pods"] == {}
    feeds.close()
