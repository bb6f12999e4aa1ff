"""The public types check their input where it enters (scheduler/input_coercion.py): usable values of
another type become the internal form, the rest a TypeError / ValueError naming the field."""

from __future__ import annotations

from collections import Counter
from types import MappingProxyType

import pytest

from scheduler import Endpoint, LLMRequest, Metrics, Scheduler

LORA_FILTER = """
plugins:
- type: lora-affinity-filter
- type: max-score-picker
"""


def test_model_names_as_a_list_reach_the_lora_filter():
    """`active_models=["lora-1"]` used to be stored as given and fail inside lora-affinity-filter."""
    pods = [
        Endpoint("has-it", metrics=Metrics(active_models=["lora-1"], max_active_models=1)),
        Endpoint("full", metrics=Metrics(active_models=("other",), max_active_models=1)),
    ]
    result = Scheduler.from_config(LORA_FILTER).schedule(LLMRequest("r1", "lora-1"), pods)
    assert result.target.name == "has-it"


@pytest.mark.parametrize(
    "given",
    [["a", "b"], ("a", "b"), {"a", "b"}, frozenset({"a", "b"}), (m for m in "ab"), {"a": 0, "b": 0}, Counter("")],
)
def test_model_names_any_iterable_or_mapping(given):
    want = {} if isinstance(given, Counter) else {"a": 0, "b": 0}
    metrics = Metrics(active_models=given)
    assert metrics.active_models == want and type(metrics.active_models) is dict


def test_model_counts_from_a_mapping():
    metrics = Metrics(active_models=Counter({"a": 2}), waiting_models=MappingProxyType({"b": 1}))
    assert (metrics.active_models, metrics.waiting_models) == ({"a": 2}, {"b": 1})


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"active_models": "lora-1"}, TypeError, "active_models"),
        ({"active_models": 3}, TypeError, "active_models"),
        ({"waiting_models": [1]}, TypeError, "waiting_models"),
        ({"active_models": {"a": "x"}.items()}, TypeError, "active_models"),
        ({"waiting_models": [""]}, TypeError, "waiting_models"),
        ({"waiting_queue_size": "3"}, TypeError, "waiting_queue_size"),
        ({"waiting_queue_size": True}, TypeError, "waiting_queue_size"),
        ({"running_requests_size": -1}, ValueError, "running_requests_size"),
        ({"max_active_models": 2.5}, ValueError, "max_active_models"),
        ({"kv_cache_usage_percent": "0.5"}, TypeError, "kv_cache_usage_percent"),
        ({"kv_cache_usage_percent": float("nan")}, ValueError, "kv_cache_usage_percent"),
        ({"update_time": -1.0}, ValueError, "update_time"),
    ],
)
def test_metrics_reject_what_plugins_can_not_use(kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        Metrics(**kwargs)


def test_metrics_numbers_are_normalised():
    m = Metrics(waiting_queue_size=2.0, kv_cache_usage_percent=1, update_time=5)
    assert (m.waiting_queue_size, m.kv_cache_usage_percent, m.update_time) == (2, 1.0, 5.0)
    assert type(m.waiting_queue_size) is int and type(m.kv_cache_usage_percent) is float


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"name": ""}, ValueError, "Endpoint.name"),
        ({"name": None}, TypeError, "Endpoint.name"),
        ({"address": 10}, TypeError, "Endpoint.address"),
        ({"port": "8000"}, TypeError, "Endpoint.port"),
        ({"port": 0}, ValueError, "Endpoint.port"),
        ({"port": 70000}, ValueError, "Endpoint.port"),
        ({"labels": [("a", "b")]}, TypeError, "Endpoint.labels"),
        ({"labels": MappingProxyType({"role": 1})}, TypeError, "Endpoint.labels"),
        ({"metrics": 5}, TypeError, "Endpoint.metrics"),
        ({"metrics": {"active_models": "x"}}, TypeError, "active_models"),
        ({"attributes": ["x"]}, TypeError, "Endpoint.attributes"),
    ],
)
def test_endpoint_rejects_what_plugins_can_not_use(kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        Endpoint(**{"name": "pod", **kwargs})


def test_endpoint_normalises_mappings():
    ep = Endpoint("pod", labels=MappingProxyType({"role": "decode"}), metrics={"active_models": ["x"]})
    assert ep.labels == {"role": "decode"} and type(ep.labels) is dict
    assert ep.metrics.active_models == {"x": 0}


def test_well_typed_values_are_kept_as_given():
    """The hot path: nothing is copied or converted when the types are already right."""
    labels, metrics, attributes = {"role": "decode"}, Metrics(), {"k": 1}
    ep = Endpoint("pod", "10.0.0.1", 8000, labels, metrics, attributes)
    assert ep.labels is labels and ep.metrics is metrics and ep.attributes is attributes
    body, headers, models = {"prompt": "x"}, {"a": "b"}, {"m": 0}
    req = LLMRequest("r", "m", body, headers)
    assert req.body is body and req.headers is headers
    assert Metrics(active_models=models).active_models is models


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"request_id": None}, TypeError, "request_id"),
        ({"target_model": ""}, ValueError, "target_model"),
        ({"target_model": None}, TypeError, "target_model"),
        ({"body": "prompt"}, TypeError, "LLMRequest.body"),
        ({"headers": [("x-a", "1")]}, TypeError, "LLMRequest.headers"),
        ({"headers": MappingProxyType({"x-a": 1})}, TypeError, "LLMRequest.headers"),
        ({"priority": "1"}, TypeError, "priority"),
        ({"priority": 0.5}, ValueError, "priority"),
        ({"excluded_endpoints": "pod-a"}, TypeError, "excluded_endpoints"),
        ({"excluded_endpoints": [1]}, TypeError, "excluded_endpoints"),
    ],
)
def test_request_rejects_what_plugins_can_not_use(kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        LLMRequest(**{"request_id": "r", "target_model": "m", **kwargs})


def test_request_normalises():
    req = LLMRequest("r", "m", priority=-1.0, excluded_endpoints=["pod-a"], received_at=3)
    assert req.priority == -1 and req.sheddable
    assert req.excluded_endpoints == frozenset({"pod-a"}) and req.received_at == 3.0
