"""vLLM's KV-cache events: the wire format, vLLM's block hashing, and the ZMQ publisher/subscriber.

Pure Python (msgspec, pyzmq, cbor2): scheduler, actors and simulator may import it; it imports none
of them, and not ray.
"""

from ray_epp.kvevents.block_hash import HASH_ALGOS, BlockHasher, external_hash
from ray_epp.kvevents.events import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
)
from ray_epp.kvevents.wire import WireError, decode_batch, encode_batch
from ray_epp.kvevents.zmq_publisher import ZmqEventPublisher
from ray_epp.kvevents.zmq_subscriber import SubscriberState, SubscriberStatus, ZmqEventSubscriber

__all__ = [
    "HASH_ALGOS",
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BlockHasher",
    "BlockRemoved",
    "BlockStored",
    "KVEvent",
    "KVEventBatch",
    "SubscriberState",
    "SubscriberStatus",
    "WireError",
    "ZmqEventPublisher",
    "ZmqEventSubscriber",
    "decode_batch",
    "encode_batch",
    "external_hash",
]
