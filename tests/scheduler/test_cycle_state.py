"""CycleState's endpoint attributes: one at a time, many at once, read back per endpoint."""

import pickle

from scheduler import CycleState


def test_endpoint_attributes_one_and_many():
    state = CycleState()
    assert state.endpoint_attributes("pod1") == {}
    state.set_endpoint_attribute("pod1", "a", 1)
    state.set_endpoint_attributes("b", {"pod1": 2, "pod2": 3})
    state.set_endpoint_attributes("b", {"pod2": 4})
    state.set_endpoint_attributes("a", {"pod3": 5})
    assert state.endpoint_attributes("pod1") == {"a": 1, "b": 2}
    assert state.endpoint_attributes("pod2") == {"b": 4}
    assert state.endpoint_attributes("pod3") == {"a": 5}
    assert state.endpoint_attributes("pod9") == {}


def test_bulk_values_are_copied_and_reads_are_new_dicts():
    state = CycleState()
    values = {"pod1": 1}
    state.set_endpoint_attributes("k", values)
    values["pod1"] = 99
    attrs = state.endpoint_attributes("pod1")
    attrs["k"] = 42
    assert state.endpoint_attributes("pod1") == {"k": 1}


def test_attributes_survive_pickling():
    state = CycleState()
    state.set_endpoint_attribute("pod1", "k", 1)
    state.write("x", 2)
    copy = pickle.loads(pickle.dumps(state))
    assert copy.endpoint_attributes("pod1") == {"k": 1}
    assert copy.read("x") == 2
