"""lora-affinity-scorer: GIE's loraaffinity/lora_affinity_test.go cases."""

import pytest

from scheduler import ScorerCategory
from scheduler.plugins.scorers.lora_affinity import LoraAffinityScorer
from scheduler.registry import plugin_class
from tests.scheduler.helpers import endpoint, fresh_state, request


def lora_pod(name, active, waiting, max_active):
    return endpoint(name, active_models=active, waiting_models=waiting, max_active_models=max_active)


CASES = [
    pytest.param(
        "active-model-1",
        [lora_pod("pod1", {"active-model-1": 1}, {}, 5)],
        {"pod1": 1.0},
        id="target model is active",
    ),
    pytest.param(
        "active-model-1",
        [lora_pod("pod1", {"active-model-2": 2}, {"active-model-1": 1}, 2)],
        {"pod1": 0.6},
        id="target model is waiting",
    ),
    pytest.param(
        "active-model-1",
        [
            lora_pod("pod1", {"active-model-2": 2}, {"active-model-3": 1}, 2),
            lora_pod("pod2", {}, {}, 0),
        ],
        {"pod1": 0.0, "pod2": 0.0},
        id="endpoints have no space for new model",
    ),
    pytest.param(
        "active-model-1",
        [
            lora_pod("pod1", {"active-model-1": 1}, {}, 5),
            lora_pod("pod2", {"active-model-2": 4}, {"active-model-1": 1}, 5),
            lora_pod("pod3", {"active-model-2": 1}, {}, 2),
            lora_pod("pod4", {"active-model-3": 1}, {"active-model-1": 1}, 2),
            lora_pod("pod5", {"active-model-4": 1, "active-model-5": 1}, {}, 2),
        ],
        {"pod1": 1.0, "pod2": 0.8, "pod3": 0.8, "pod4": 0.6, "pod5": 0.0},
        id="multiple endpoints with mixed active and waiting models",
    ),
    pytest.param("modelA", [], {}, id="empty pods slice"),
]


@pytest.mark.parametrize(("model", "eps", "expected"), CASES)
def test_lora_affinity_scorer(model, eps, expected):
    scores = LoraAffinityScorer().score(fresh_state(), request(model=model), eps)
    assert {ep.name: s for ep, s in scores.items()} == pytest.approx(expected, abs=1e-4)


def test_registered_by_gie_type_name():
    assert plugin_class("lora-affinity-scorer") is LoraAffinityScorer
    assert LoraAffinityScorer.category is ScorerCategory.AFFINITY
