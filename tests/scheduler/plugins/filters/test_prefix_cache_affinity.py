"""prefix-cache-affinity-filter (llm-d's scheduling/filter/prefixcacheaffinity/plugin_test.go's
cases) as a table over a real approximate prefix index and real in-flight token counts, then
llm-d's sticky-until-saturated config end to end in the scheduler."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler import Scheduler
from scheduler.config import load_config, load_config_file
from scheduler.errors import ConfigError
from tests.scheduler.helpers import as_in_profile, endpoint, request

ROOT = Path(__file__).resolve().parents[4]
STICKY_CONFIG = ROOT / "bench" / "configs" / "llmd-sticky-until-saturated.yaml"
SHARED = "You are a helpful assistant. " * 40  # ~280 tokens: 17 blocks of 16


def scheduler(**filter_params) -> Scheduler:
    return Scheduler.from_config(
        load_config(
            {
                "plugins": [
                    {"type": "approx-prefix-cache-producer", "parameters": {"blockSizeTokens": 16}},
                    {"type": "prefix-cache-affinity-filter", "parameters": filter_params},
                    {"type": "token-load-scorer"},
                ],
                "schedulingProfiles": [
                    {"name": "default", "plugins": [{"pluginRef": "prefix-cache-affinity-filter"},
                                                     {"pluginRef": "token-load-scorer"}]}
                ],
            }
        )
    )  # fmt: skip


def warm(sched: Scheduler, pod: str, prompt: str = SHARED, request_id: str = "warm", done: bool = True) -> None:
    """`pod` served `prompt`: the producer learns it (and, unless `done`, its tokens stay in flight)."""
    result = sched.schedule(request(prompt=prompt, request_id=request_id), [endpoint(pod)])
    if done:
        sched.response_complete(request(request_id=request_id), pod)
    assert result.profile_results["default"].target_endpoints[0].name == pod


def kept(sched: Scheduler, prompt: str, pods: list[str]) -> tuple[list[str], str]:
    """The endpoints the filter keeps for this prompt, and the outcome it counted."""
    f = sched.plugins["prefix-cache-affinity-filter"]
    before = dict(f.decisions)
    out = as_in_profile(sched, f, request(prompt=prompt, request_id="q"), [endpoint(p) for p in pods])
    (outcome,) = [k for k, n in f.decisions.items() if n != before[k]]
    return sorted(ep.name for ep in out), outcome


@pytest.mark.parametrize(
    ("params", "in_flight_on_a", "prompt", "expected", "outcome"),
    [
        # a holds the whole prompt: only a stays
        ({}, 0, SHARED + "Q1", ["a"], "sticky"),
        # nobody holds >= 80 % of an unrelated prompt: everyone stays
        ({}, 0, "an unrelated prompt " * 40, ["a", "b", "c"], "no_match"),
        # a holds 17 of ~34 blocks (< 0.8): no sticky endpoint
        ({}, 0, SHARED + "another long question " * 25, ["a", "b", "c"], "no_match"),
        # the threshold lowered to 0.4: a is sticky again
        ({"affinityThreshold": 0.4}, 0, SHARED + "another long question " * 25, ["a"], "sticky"),
        # a saturated: 300,000 tokens in flight / 15,928 tokens/s = 18.8 s > 18 s later than b or c
        ({}, 300_000, SHARED + "Q1", ["a", "b", "c"], "load_override"),
        # the same load under a looser gate (20 s) or none (0 = always stick): a alone
        ({"maxTTFTPenaltyMs": 20000}, 300_000, SHARED + "Q1", ["a"], "sticky"),
        ({"maxTTFTPenaltyMs": 0}, 300_000, SHARED + "Q1", ["a"], "sticky"),
        # a faster measured prefill: 300,000 tokens at 100,000 tokens/s is 3 s, under the gate
        ({"peakPrefillThroughput": 100000}, 300_000, SHARED + "Q1", ["a"], "sticky"),
        # exploration always: the gate is skipped
        ({"explorationProbability": 1.0}, 0, SHARED + "Q1", ["a", "b", "c"], "exploration"),
        # a threshold of 0 turns the filter off
        ({"affinityThreshold": 0.0}, 0, SHARED + "Q1", ["a", "b", "c"], "not_applicable"),
    ],
)
def test_the_filter(params, in_flight_on_a, prompt, expected, outcome):
    sched = scheduler(**params)
    warm(sched, "a")
    if in_flight_on_a:
        # one request of in_flight_on_a tokens (4 characters a token), not yet at its first token
        warm(sched, "a", prompt="x " * (2 * in_flight_on_a), request_id="busy", done=False)
    assert kept(sched, prompt, ["a", "b", "c"]) == (expected, outcome)


ESCAPE = {"saturationConditions": [{"metric": "waiting-queue", "maxValue": 5},
                                    {"metric": "kv-cache-utilization", "maxValue": 0.8}]}  # fmt: skip


@pytest.mark.parametrize(
    ("scraped", "warm_on", "expected", "outcome"),
    [
        # the only holder's scraped queue is over 5: not sticky, every endpoint stays
        ({"a": {"waiting_queue_size": 6}}, ["a"], ["a", "b", "c"], "saturated"),
        # its KV use is over 0.8: the same
        ({"a": {"kv_cache_usage_percent": 0.97}}, ["a"], ["a", "b", "c"], "saturated"),
        # at the line (queue 5, KV 0.8) it keeps its claim
        ({"a": {"waiting_queue_size": 5, "kv_cache_usage_percent": 0.8}}, ["a"], ["a"], "sticky"),
        # two holders, one saturated: the other alone is sticky
        ({"a": {"waiting_queue_size": 50}}, ["a", "b"], ["b"], "sticky"),
        # a saturated endpoint that does not hold the prompt changes nothing
        ({"c": {"waiting_queue_size": 50}}, ["a"], ["a"], "sticky"),
    ],
)
def test_a_saturated_endpoint_is_not_sticky(scraped, warm_on, expected, outcome):
    """The scraped escape: load this router never sent (its in-flight ledger is empty here) still
    ends a holder's claim."""
    sched = scheduler(**ESCAPE)
    for pod in warm_on:
        warm(sched, pod, request_id=f"warm-{pod}")
    f = sched.plugins["prefix-cache-affinity-filter"]
    before = dict(f.decisions)
    pods = [endpoint(p, **scraped.get(p, {})) for p in ("a", "b", "c")]
    out = as_in_profile(sched, f, request(prompt=SHARED + "Q1", request_id="q"), pods)
    assert sorted(ep.name for ep in out) == expected
    assert [k for k, n in f.decisions.items() if n != before[k]] == [outcome]


def test_one_endpoint_is_not_filtered():
    sched = scheduler()
    assert kept(sched, SHARED, ["a"]) == (["a"], "not_applicable")


def test_a_cold_predictor_is_a_missing_signal_and_keeps_all():
    sched = Scheduler.from_config(
        load_config(
            {
                "plugins": [
                    {"type": "approx-prefix-cache-producer", "parameters": {"blockSizeTokens": 16}},
                    {"type": "predicted-latency-producer"},
                    {"type": "prefix-cache-affinity-filter", "parameters": {"ttftSource": "latencyPredictor"}},
                    {"type": "token-load-scorer"},
                ],
                "schedulingProfiles": [
                    {"name": "default", "plugins": [{"pluginRef": "prefix-cache-affinity-filter"},
                                                     {"pluginRef": "token-load-scorer"}]}
                ],
            }
        )
    )  # fmt: skip
    warm(sched, "a")
    assert kept(sched, SHARED + "Q1", ["a", "b"]) == (["a", "b"], "missing_signal")


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"prefillCalibrationFile": "/etc/llm-d/calibration.json"}, "set peakPrefillThroughput"),
        ({"peakPrefillThroughput": 0}, "peakPrefillThroughput must be > 0"),
        ({"affinityThreshold": 1.5}, "affinityThreshold"),
        ({"ttftSource": "magic"}, "ttftSource"),
        ({"saturationConditions": [{"metric": "active-requests", "maxValue": 4}]}, "read scraped metrics"),
        ({"saturationConditions": [{"metric": "kv-cache-utilization", "maxValue": 80}]}, "is a fraction"),
    ],
)
def test_bad_parameters_are_config_errors(params, fragment):
    with pytest.raises(ConfigError, match=fragment):
        scheduler(**params)


def test_sticky_until_saturated_end_to_end():
    """llm-d's config as written: a shared prefix stays on its first pod while that pod keeps up,
    a new prefix goes to the pod with the fewest tokens in flight."""
    sched = Scheduler.from_config(load_config_file(STICKY_CONFIG))
    pods = [endpoint("a"), endpoint("b"), endpoint("c")]
    first = sched.schedule(request(prompt=SHARED + "Q0", request_id="r0"), pods)
    home = first.profile_results["default"].target_endpoints[0].name
    for i in range(1, 6):  # all still in flight: the home's load grows, but stays far under the gate
        chosen = sched.schedule(request(prompt=SHARED + f"Q{i}", request_id=f"r{i}"), pods)
        assert chosen.profile_results["default"].target_endpoints[0].name == home
    other = sched.schedule(request(prompt="a different document " * 40, request_id="n"), pods)
    assert other.profile_results["default"].target_endpoints[0].name != home
