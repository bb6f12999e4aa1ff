"""load-aware-scorer: llm-d's loadaware/load_aware_test.go case, plus the threshold default and
validation."""

import pytest

from scheduler import ConfigError, Scheduler, ScorerCategory
from scheduler.plugins.scorers.load_aware import LoadAwareParameters, LoadAwareScorer
from tests.scheduler.helpers import endpoint, fresh_state, request


def scores_for(scorer, queues):
    eps = [endpoint(name, waiting_queue_size=q) for name, q in queues.items()]
    return {ep.name: s for ep, s in scorer.score(fresh_state(), request("critical"), eps).items()}


def test_load_based_scorer():
    scorer = LoadAwareScorer(params=LoadAwareParameters(threshold=10))
    got = scores_for(scorer, {"pod-a": 2, "pod-b": 0, "pod-c": 15})
    assert got == pytest.approx({"pod-a": 0.4, "pod-b": 0.5, "pod-c": 0.0})


def test_default_threshold_is_128():
    got = scores_for(LoadAwareScorer(), {"empty": 0, "half": 64, "at": 128, "over": 500})
    assert got == pytest.approx({"empty": 0.5, "half": 0.25, "at": 0.0, "over": 0.0})
    assert LoadAwareScorer.category is ScorerCategory.DISTRIBUTION


def test_threshold_from_config_and_non_positive_rejected():
    yaml_text = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: load-aware-scorer
  parameters: {threshold: 4}
"""
    sched = Scheduler.from_config(yaml_text)
    assert sched.plugins["load-aware-scorer"].params.threshold == 4
    with pytest.raises(ConfigError, match="threshold"):
        Scheduler.from_config(yaml_text.replace("threshold: 4", "threshold: 0"))
