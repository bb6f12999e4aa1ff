"""P/D end to end: ray_epp/configs/pd.yaml (llm-d's sample) through Scheduler.from_config(load_config(...)),
with the real prefix-cache scorer learning each decision (the Scheduler runs pre_request), and llm-d's
disagg scheduler_test.go TestPDSchedule table."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler import ErrorCode, LLMRequest, Scheduler, SchedulingError, load_config, load_config_file
from scheduler.plugins.filters.roles import ROLE_LABEL
from scheduler.plugins.handlers.disagg import DisaggProfileHandler
from scheduler.plugins.support.prefix import prefix_block_hashes
from scheduler.trace import SchedulingTrace
from tests.scheduler.helpers import endpoint, request

PD_CONFIG = Path(__file__).resolve().parents[2] / "ray_epp" / "configs" / "pd.yaml"

# 40 blocks of 16 tokens x 4 chars: a prompt the prefix index cuts on a block boundary.
SYSTEM = ("You are a helpful assistant. Answer briefly!" * 60)[: 64 * 40]
LONG = SYSTEM  # 640 tokens, far above nonCachedTokens (16)


def role(name: str, value: str | None, **metrics):
    return endpoint(name, {ROLE_LABEL: value} if value is not None else {}, **metrics)


def pool():
    """Two prefill and two decode pods; p1 and d1 have the shortest queues."""
    return [
        role("p1", "prefill"),
        role("p2", "prefill", waiting_queue_size=5),
        role("d1", "decode"),
        role("d2", "decode", waiting_queue_size=3),
    ]


def pd_scheduler() -> Scheduler:
    return Scheduler.from_config(load_config_file(PD_CONFIG))


def targets(result) -> dict:
    return result.to_json()["profiles"]


def test_pd_yaml_is_llm_d_sample():
    cfg = load_config_file(PD_CONFIG)
    assert cfg.api_version == "llm-d.ai/v1alpha1"
    types = {p.name: p.type for p in cfg.plugins}
    assert types["disagg-profile-handler"] == "disagg-profile-handler"
    assert cfg.plugin_spec("prefix-based-pd-decider").parameters == {"nonCachedTokens": 16}
    weights = {p.name: {r.plugin_ref: r.weight for r in p.plugins} for p in cfg.scheduling_profiles}
    assert weights == {
        "prefill": {"prefill-filter": None, "max-score-picker": None, "prefix-cache-scorer": 2, "queue-scorer": 1},
        "decode": {"decode-filter": None, "max-score-picker": None, "prefix-cache-scorer": 2, "queue-scorer": 1},
    }
    sched = pd_scheduler()
    assert isinstance(sched.handler, DisaggProfileHandler)
    assert sched.profiles["decode"].scorers[0].scorer is sched.profiles["prefill"].scorers[0].scorer  # one index


def test_long_uncached_prompt_gets_prefill_and_decode():
    sched = pd_scheduler()
    trace = SchedulingTrace()
    got = sched.schedule(request(prompt=LONG), pool(), trace=trace)
    assert got.primary_profile_name == "decode"
    assert got.prefill_profile_name == "prefill"
    assert targets(got) == {"decode": ["d1"], "prefill": ["p1"]}
    assert got.target.labels[ROLE_LABEL] == "decode"
    assert got.profile_results["prefill"].target_endpoints[0].labels[ROLE_LABEL] == "prefill"
    assert trace.rounds == [["decode"], ["prefill"]]
    assert trace.to_json()["disagg"] == {"decode": "ran", "prefill": "ran", "decision": "prefill-decode"}


def test_the_index_learns_decode_and_prefill_targets_then_a_repeat_is_decode_only():
    sched = pd_scheduler()
    first = sched.schedule(request(prompt=LONG, request_id="a"), pool())
    assert targets(first) == {"decode": ["d1"], "prefill": ["p1"]}

    scorer = sched.plugins["prefix-cache-scorer/producer"]
    hashes = prefix_block_hashes(request(prompt=LONG), 16, 256)
    assert scorer.index.match(hashes) == {"d1": len(hashes), "p1": len(hashes)}

    trace = SchedulingTrace()
    second = sched.schedule(request(prompt=LONG, request_id="b"), pool(), trace=trace)
    assert targets(second) == {"decode": ["d1"]}
    assert "prefill" not in second.profile_results  # skipped by the decider, not failed
    assert trace.rounds == [["decode"]]
    assert trace.to_json()["disagg"] == {"decode": "ran", "prefill": "skipped", "decision": "decode-only"}


@pytest.mark.parametrize(
    ("suffix", "want"),
    [
        pytest.param("", {"decode": ["d1"]}, id="the same prompt"),
        pytest.param(" Now a question?" * 2, {"decode": ["d1"]}, id="8 new tokens < 16: decode only"),
        pytest.param(" And a question?" * 4, {"decode": ["d1"], "prefill": ["p1"]}, id="16 new tokens: P/D"),
        pytest.param(" And a question?" * 40, {"decode": ["d1"], "prefill": ["p1"]}, id="160 new tokens: P/D"),
    ],
)
def test_the_uncached_suffix_decides(suffix, want):
    sched = pd_scheduler()
    sched.schedule(request(prompt=SYSTEM, request_id="warm"), pool())
    assert targets(sched.schedule(request(prompt=SYSTEM + suffix, request_id="next"), pool())) == want


def test_a_cached_prefix_moves_decode_to_the_pod_that_holds_it():
    sched = pd_scheduler()
    eps = pool()
    sched.schedule(request(prompt=LONG, request_id="a"), eps)  # d1 and p1 learn LONG
    busy = [role("p1", "prefill"), role("p2", "prefill"), role("d1", "decode", waiting_queue_size=4), eps[3]]
    got = sched.schedule(request(prompt=LONG + " And a question?" * 10, request_id="b"), busy)
    # prefix 2 x 1.0 on d1 outweighs queue 1 x 1.0 on d2; the 40 new tokens still need a prefill
    assert targets(got) == {"decode": ["d1"], "prefill": ["p1"]}


@pytest.mark.parametrize(
    "req",
    [
        pytest.param(request(prompt="Hi there!"), id="completions"),
        pytest.param(
            LLMRequest("r1", "base", body={"model": "base", "messages": [{"role": "user", "content": "Hi!"}]}),
            id="chat",
        ),
    ],
)
def test_short_prompt_is_decode_only(req):
    trace = SchedulingTrace()
    got = pd_scheduler().schedule(req, pool(), trace=trace)
    assert targets(got) == {"decode": ["d1"]}
    assert trace.to_json()["disagg"]["prefill"] == "skipped"


def test_long_chat_prompt_gets_prefill():
    body = {"model": "base", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}]}
    got = pd_scheduler().schedule(LLMRequest("r1", "base", body=body), pool())
    assert targets(got) == {"decode": ["d1"], "prefill": ["p1"]}


def test_no_prefill_pod_is_served_by_decode_alone():
    trace = SchedulingTrace()
    decode_pods = [role("d1", "decode"), role("d2", "decode", waiting_queue_size=3)]
    got = pd_scheduler().schedule(request(prompt=LONG), decode_pods, trace=trace)
    assert got.primary_profile_name == "decode"
    assert "prefill" in got.profile_results and got.profile_results["prefill"] is None  # ran and failed
    assert targets(got) == {"decode": ["d1"], "prefill": None}
    assert got.target.name == "d1"
    assert trace.rounds == [["decode"], ["prefill"]]
    assert trace.profiles["prefill"]["error"]
    assert trace.to_json()["disagg"] == {"decode": "ran", "prefill": "failed", "decision": "decode-only"}


def test_prefill_failure_leaves_the_index_to_decode():
    sched = pd_scheduler()
    sched.schedule(request(prompt=LONG), [role("d1", "decode")])
    hashes = prefix_block_hashes(request(prompt=LONG), 16, 256)
    assert sched.plugins["prefix-cache-scorer/producer"].index.match(hashes) == {"d1": len(hashes)}


@pytest.mark.parametrize("prompt", [LONG, "short"])
def test_no_decode_pod_fails_the_request(prompt):
    sched = pd_scheduler()
    trace = SchedulingTrace()
    with pytest.raises(SchedulingError) as err:
        sched.schedule(request(prompt=prompt), [role("p1", "prefill"), role("p2", "prefill")], trace=trace)
    assert err.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert "failed to find available decode workers" in err.value.message
    assert trace.rounds == [["decode"]]  # prefill is not even asked
    assert trace.to_json()["disagg"] == {"decode": "failed"}
    assert sched.plugins["prefix-cache-scorer/producer"].index.servers() == []


def test_unlabelled_and_dual_role_pods():
    """A pod without the role label is decode-capable; prefill-decode pods serve both profiles."""
    got = pd_scheduler().schedule(request(prompt=LONG), [role("plain", None), role("p1", "prefill")])
    assert targets(got) == {"decode": ["plain"], "prefill": ["p1"]}
    got = pd_scheduler().schedule(request(prompt=LONG), [role("pd1", "prefill-decode")])
    assert targets(got) == {"decode": ["pd1"], "prefill": ["pd1"]}


def test_custom_profile_names_end_to_end():
    """profiles.decode / profiles.prefill renamed: the index still learns the prefill target (the
    result names its prefill profile), and the repeat is decode-only."""
    handler = "      prefill: prefix-based-pd-decider\n"
    text = PD_CONFIG.read_text().replace(handler, handler + "    profiles: {decode: dec, prefill: pre}\n")
    text = text.replace("- name: prefill", "- name: pre").replace("- name: decode", "- name: dec")
    sched = Scheduler.from_config(load_config(text))
    assert (sched.handler.decode_profile, sched.handler.prefill_profile) == ("dec", "pre")
    first = sched.schedule(request(prompt=LONG, request_id="a"), pool())
    assert first.primary_profile_name == "dec" and first.prefill_profile_name == "pre"
    assert targets(first) == {"dec": ["d1"], "pre": ["p1"]}
    hashes = prefix_block_hashes(request(prompt=LONG), 16, 256)
    assert set(sched.plugins["prefix-cache-scorer/producer"].index.match(hashes)) == {"d1", "p1"}
    assert targets(sched.schedule(request(prompt=LONG, request_id="b"), pool())) == {"dec": ["d1"]}


# -- llm-d's TestPDSchedule (profilehandler/disagg/scheduler_test.go) -----------------------------

LLM_D_TEST_CONFIG = """
plugins:
- type: prefill-filter
- type: decode-filter
- type: load-aware-scorer
- type: prefix-cache-scorer
  parameters: {autoTune: false, blockSizeTokens: 1}
- type: max-score-picker
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: 2}
- type: disagg-profile-handler
  parameters:
    deciders: {prefill: prefix-based-pd-decider}
schedulingProfiles:
- name: prefill
  plugins:
  - {pluginRef: prefill-filter}
  - {pluginRef: prefix-cache-scorer, weight: 50}
- name: decode
  plugins:
  - {pluginRef: decode-filter}
  - {pluginRef: load-aware-scorer, weight: 1}
  - {pluginRef: prefix-cache-scorer, weight: 0}
"""

ENDPOINT1 = ("endpoint1", "prefill", 0)
ENDPOINT2 = ("endpoint2", "decode", 0)
NO_ROLE1 = ("noRoleEndpoint1", None, 2)
PD = {"decode": ["endpoint2"], "prefill": ["endpoint1"]}
D = {"decode": ["endpoint2"]}


@pytest.mark.parametrize(
    ("prompt", "pods", "want", "want2"),
    [
        pytest.param("12345678901", [], "error", None, id="no candidate endpoints"),
        # llm-d drops the failed prefill; GIE (PR #1013) keeps it as None
        pytest.param("12345678901", [ENDPOINT2], {**D, "prefill": None}, None, id="one decode endpoint, long prompt"),
        pytest.param("12345678901", [ENDPOINT1], "error", None, id="one prefill endpoint, long prompt"),
        pytest.param("12345678906", [ENDPOINT1, ENDPOINT2], PD, D, id="1P1D - long prompt"),
        pytest.param("12345", [ENDPOINT1, ENDPOINT2], D, D, id="1P1Dshort"),
        pytest.param(
            "12345678901",
            [ENDPOINT1, NO_ROLE1],
            {"decode": ["noRoleEndpoint1"], "prefill": ["endpoint1"]},
            None,
            id="TestRolesWithNoDecode",
        ),
        pytest.param("1234567890123456789012345678901234567890", [ENDPOINT1, ENDPOINT2, NO_ROLE1], PD, D, id="1P2D"),
    ],
)
def test_llm_d_pd_schedule(prompt, pods, want, want2):
    sched = Scheduler.from_config(load_config(LLM_D_TEST_CONFIG))
    eps = [role(name, value, waiting_queue_size=queue) for name, value, queue in pods]
    req = LLMRequest("r1", "critical", body={"model": "critical", "prompt": prompt})
    if want == "error":
        with pytest.raises(SchedulingError):
            sched.schedule(req, eps)
        return
    got = sched.schedule(req, eps)
    assert got.primary_profile_name == "decode"
    assert targets(got) == want
    if want2 is not None:  # a second call: the decode pod now holds the prompt
        again = LLMRequest("r2", "critical", body={"model": "critical", "prompt": prompt})
        assert targets(sched.schedule(again, eps)) == want2
