"""Typed data keys and producers (scheduler/data_keys.py, the Producer role, the config build's
check): keys by name and producer, typed reads and writes, request data that stays in its
process, and profiles that run their producers, in order, before their filters."""

from __future__ import annotations

import pickle

import pytest

from scheduler import ConfigError, CycleState, LLMRequest, Scheduler, load_config
from scheduler.config import build_plugins
from scheduler.data_keys import DataKey, RequestData
from scheduler.interfaces import Filter, Producer
from scheduler.registry import register
from tests.scheduler.helpers import endpoint, request

SEEN: DataKey[list[str]] = DataKey("test/seen", "test-seen-producer")
DOUBLED: DataKey[int] = DataKey("test/doubled", "test-doubling-producer")


def test_a_key_is_its_name_and_its_producer():
    assert DataKey("test/seen", "test-seen-producer") == SEEN and hash(SEEN) == hash(
        DataKey(*["test/seen"] * 1, "test-seen-producer")
    )
    assert SEEN.of("other") == DataKey("test/seen", "other") != SEEN
    assert SEEN.of("") is SEEN and SEEN.of(SEEN.producer) is SEEN
    assert str(SEEN.of("p")) == "test/seen/p" and str(DataKey("plain")) == "plain"


def test_cycle_state_typed_reads_and_writes_travel_with_it():
    state = CycleState()
    assert state.get(SEEN) is None and state.get(SEEN, []) == []
    state.put(SEEN, ["a"])
    state.write("test/seen", "a string key is another key")
    assert state.get(SEEN) == ["a"] and SEEN in state
    copy = pickle.loads(pickle.dumps(state))  # as the gateway sends it to a profile actor
    assert copy.get(SEEN) == ["a"] and copy.read("test/seen") == "a string key is another key"
    state.set_endpoint_attributes(SEEN, {"pod1": 1})  # endpoint attributes go by the key's name
    assert state.endpoint_attributes("pod1") == {"test/seen": 1}
    assert state.attribute_by_endpoint(SEEN) == {"pod1": 1}


def test_request_data_stays_in_its_process():
    req = LLMRequest("r", "m", {"prompt": "hello"})
    assert req.prompt_text() == "hello" and len(req.derived) == 1
    req.derived.put(DOUBLED, 2)
    copy = pickle.loads(pickle.dumps(req))
    assert copy.prompt_text() == "hello" and copy.derived.get(DOUBLED) is None
    assert req.derived.pop(DOUBLED) == 2 and DOUBLED not in req.derived
    with pytest.raises(TypeError, match=r"LLMRequest\.derived must be a RequestData"):
        LLMRequest("r", "m", derived={})  # type: ignore[arg-type]
    assert isinstance(LLMRequest("r", "m").derived, RequestData)


@register
class SeenProducer(Producer):
    """Writes the names of the endpoints the profile's filters will get."""

    type_name = "test-seen-producer"

    def setup(self, handle) -> None:
        self.produces = (SEEN.of(self.name),)
        self.calls = 0

    def produce(self, cycle_state, request, endpoints) -> None:
        self.calls += 1
        cycle_state.put(self.produces[0], [ep.name for ep in endpoints])


@register
class DoublingProducer(Producer):
    """Reads the seen producer's key: it must run after it."""

    type_name = "test-doubling-producer"
    consumes = (SEEN,)

    def setup(self, handle) -> None:
        self.produces = (DOUBLED.of(self.name),)

    def produce(self, cycle_state, request, endpoints) -> None:
        cycle_state.put(self.produces[0], 2 * len(cycle_state.get(SEEN, ())))


@register
class DoubledFilter(Filter):
    """Keeps the first `doubled / 2` endpoints: fails if its producer did not run first."""

    type_name = "test-doubled-filter"
    consumes = (DOUBLED,)

    def filter(self, cycle_state, request, endpoints):
        return endpoints[: cycle_state.get(DOUBLED, 0) // 2]


def config(plugins: list[str], refs: list[str]) -> dict:
    return {
        "plugins": [{"type": t} for t in plugins],
        "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": r} for r in refs]}],
    }


def test_producers_run_before_the_filters_dependencies_first():
    cfg = load_config(
        config(["test-doubled-filter", "test-doubling-producer", "test-seen-producer"], ["test-doubled-filter"])
    )
    built = build_plugins(cfg)
    profile = built.profiles["default"]
    assert [p.type_name for p in profile.producers] == ["test-seen-producer", "test-doubling-producer"]
    assert profile.plugins()[:2] == profile.producers
    sched = Scheduler.from_config(cfg)
    eps = [endpoint("a"), endpoint("b")]
    assert sched.schedule(request(), eps).target.name in {"a", "b"}
    assert sched.plugins["test-seen-producer"].calls == 1


def test_a_listed_producer_runs_even_when_no_plugin_reads_it():
    cfg = load_config(config(["test-seen-producer"], ["test-seen-producer"]))
    assert [p.name for p in build_plugins(cfg).profiles["default"].producers] == ["test-seen-producer"]


@register
class SeenIfThereProducer(Producer):
    """Reads the seen producer's data when its profile runs it, and does without otherwise."""

    type_name = "test-seen-if-there-producer"
    runs_after = (SEEN.name,)
    produces = (DataKey("test/seen-if-there", "test-seen-if-there-producer"),)

    def produce(self, cycle_state, request, endpoints) -> None:
        cycle_state.put(self.produces[0], len(cycle_state.get(SEEN, ())))


def test_a_producer_runs_after_the_producers_of_what_it_reads_when_present_and_adds_none():
    listed = ["test-seen-if-there-producer", "test-seen-producer"]
    cfg = load_config(config(listed, listed))
    assert [p.name for p in build_plugins(cfg).profiles["default"].producers] == listed[::-1]
    cfg = load_config(config(listed, listed[:1]))  # the seen producer configured, in no profile
    assert [p.name for p in build_plugins(cfg).profiles["default"].producers] == listed[:1]


@pytest.mark.parametrize(
    ("plugins", "missing"),
    [
        (
            ["test-doubled-filter"],
            "'test-doubled-filter' (type test-doubled-filter) reads the data key 'test/doubled/test-doubling-producer'",
        ),
        (
            ["test-doubled-filter", "test-doubling-producer"],
            "'test-doubling-producer' (type test-doubling-producer) reads the data key 'test/seen/test-seen-producer'",
        ),
    ],
)
def test_a_consumed_key_without_a_producer_fails_the_load_naming_plugin_and_key(plugins, missing):
    with pytest.raises(ConfigError) as err:
        load_config(config(plugins, ["test-doubled-filter"]))
    assert missing in str(err.value) and "which no plugin in 'plugins' produces" in str(err.value)


LOOP_A: DataKey[int] = DataKey("test/loop-a", "test-loop-a")
LOOP_B: DataKey[int] = DataKey("test/loop-b", "test-loop-b")


@register
class LoopA(Producer):
    type_name = "test-loop-a"
    produces = (LOOP_A,)
    consumes = (LOOP_B,)

    def produce(self, cycle_state, request, endpoints) -> None: ...


@register
class LoopB(Producer):
    type_name = "test-loop-b"
    produces = (LOOP_B,)
    consumes = (LOOP_A,)

    def produce(self, cycle_state, request, endpoints) -> None: ...


def test_producers_that_read_each_other_are_a_config_error():
    with pytest.raises(
        ConfigError, match="producers read each other's keys in a cycle: test-loop-a -> test-loop-b -> test-loop-a"
    ):
        load_config(config(["test-loop-a", "test-loop-b"], ["test-loop-a"]))
