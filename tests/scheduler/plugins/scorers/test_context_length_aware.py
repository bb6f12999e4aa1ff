"""context-length-aware: llm-d's cases (llm-d/llm-d-router pkg/epp/framework/plugins/scheduling/
scorer/contextlengthaware/context_length_aware_test.go) as tables, with exact values from its
formula, the filter mode, and a config where a long prompt goes to the long-context pod."""

from __future__ import annotations

import pytest

from scheduler import Scheduler
from scheduler.config import load_config
from scheduler.errors import ConfigError
from scheduler.plugins.scorers.context_length_aware import ContextLengthAware, parse_range, range_score
from tests.scheduler.helpers import endpoint, fresh_state, names, request

LABEL = "llm-d.ai/context-length-range"


def prompt_of(tokens: int) -> str:
    return "abcd" * tokens  # 4 characters per estimated token


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0-100", (0, 100)),
        (" 10 - 20 ", (10, 20)),
        ("", None),
        ("0-100-200", None),
        ("100-50", None),
        ("abc-100", None),
    ],
)
def test_parse_range(text, want):
    assert parse_range(text) == want


@pytest.mark.parametrize(
    ("tokens", "low", "high", "want"),
    [
        (10, 10, 10, 1.0),  # zero width
        (0, 0, 10000, 0.3 + 0.7 * (0.7 * 0.5 + 0.3 * 1.0)),
        (5000, 0, 10000, 0.3 + 0.7 * (0.7 * 0.5 + 0.3 * 0.5)),
        (9000, 0, 2048, 0.3 / (1 + 6952 / 1000)),
        (9000, 0, 8192, 0.3 / (1 + 808 / 1000)),
        (50, 500, 2048, 0.3 / (1 + 450 / 1000)),
    ],
)
def test_range_score(tokens, low, high, want):
    assert range_score(tokens, low, high) == pytest.approx(want)


def test_llmd_orderings():
    assert range_score(9000, 0, 8192) > range_score(9000, 0, 2048)  # exceeds: prefer the larger max
    assert range_score(50, 100, 1024) > range_score(50, 500, 2048)  # below: prefer the closer min
    assert range_score(14999, 0, 15000) > 0.3 > range_score(14999, 15001, 20000)  # in range beats out


EPS = [
    endpoint("short", {LABEL: "0-2048"}),
    endpoint("long", {LABEL: "2048-32768"}),
    endpoint("plain"),
    endpoint("broken", {LABEL: "lots"}),
]


def plugin(**params) -> ContextLengthAware:
    return ContextLengthAware(params=ContextLengthAware.Parameters.model_validate(params))


@pytest.mark.parametrize(
    ("tokens", "want"),
    [
        (100, {"short": range_score(100, 0, 2048), "long": range_score(100, 2048, 32768), "plain": 0.5, "broken": 0.0}),
        (
            9000,
            {"short": range_score(9000, 0, 2048), "long": range_score(9000, 2048, 32768), "plain": 0.5, "broken": 0.0},
        ),
    ],
)
def test_score(tokens, want):
    scores = plugin().score(fresh_state(), request(prompt=prompt_of(tokens)), EPS)
    assert {e.name: s for e, s in scores.items()} == pytest.approx(want)


@pytest.mark.parametrize(
    ("filtering", "tokens", "want"),
    [
        (False, 9000, ["short", "long", "plain", "broken"]),
        (True, 9000, ["long", "plain"]),
        (True, 100, ["short", "plain"]),
    ],
)
def test_filter(filtering, tokens, want):
    kept = plugin(enableFiltering=filtering).filter(fresh_state(), request(prompt=prompt_of(tokens)), EPS)
    assert names(kept) == want


def test_a_long_prompt_goes_to_the_long_context_pod():
    cfg = load_config(
        {
            "plugins": [{"type": "context-length-aware"}, {"type": "queue-scorer"}],
            "schedulingProfiles": [
                {
                    "name": "default",
                    "plugins": [{"pluginRef": "context-length-aware", "weight": 3}, {"pluginRef": "queue-scorer"}],
                }
            ],
        }
    )
    sched = Scheduler.from_config(cfg)
    eps = [endpoint("short", {LABEL: "0-2048"}), endpoint("long", {LABEL: "2048-32768"}, waiting_queue_size=2)]
    pick = sched.schedule(request(prompt=prompt_of(9000)), eps)
    assert pick.profile_results["default"].target_endpoints[0].name == "long"
    pick = sched.schedule(request(prompt=prompt_of(100)), eps)
    assert pick.profile_results["default"].target_endpoints[0].name == "short"


def test_an_empty_label_name_is_a_config_error():
    with pytest.raises(ConfigError, match=r"parameters\.label"):
        load_config({"plugins": [{"type": "context-length-aware", "parameters": {"label": ""}}]})
