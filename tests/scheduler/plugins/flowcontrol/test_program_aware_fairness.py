"""`program-aware-fairness` (LAS): attained service decays with its half-life, the head-wait term
breaks ties and can outweigh a small service gap, idle programs are forgotten, and the
parameters are checked as llm-d checks them."""

from __future__ import annotations

import pytest

from scheduler.config import load_config
from scheduler.errors import ConfigError
from scheduler.flowcontrol.types import FAIRNESS_ID_HEADER, FlowItem, FlowQueue
from scheduler.plugins.flowcontrol.program_aware import ProgramAwareFairness, ProgramAwareParameters
from tests.scheduler.helpers import FakeClock, request


def policy(**params) -> tuple[ProgramAwareFairness, FakeClock]:
    p = ProgramAwareFairness(params=ProgramAwareParameters.model_validate(params))
    clock = FakeClock()
    p.clock = clock
    return p, clock


def flow(program: str, enqueued_at: float) -> FlowQueue:
    q = FlowQueue(program, key=lambda item: (item.enqueue_time,))
    q.push(FlowItem(f"{program}-r", fairness_id=program, enqueue_time=enqueued_at))
    return q


def served(p: ProgramAwareFairness, program: str, prompt: int, completion: int) -> None:
    p.response_usage(request(headers={FAIRNESS_ID_HEADER: program}), prompt, completion)


def test_service_is_prompt_plus_twice_completion_halving_each_half_life():
    p, clock = policy(lasHalfLifeSeconds=10)
    served(p, "a", 100, 50)
    assert p.service("a") == 200
    clock.now += 10
    assert p.service("a") == pytest.approx(100)
    served(p, "a", 0, 50)
    assert p.service("a") == pytest.approx(200)
    q, _ = policy(lasHalfLifeSeconds=0)  # 0: cumulative
    served(q, "a", 10, 0)
    assert q.service("a") == 10


def test_least_served_goes_first_unless_the_wait_outweighs_the_gap():
    p, clock = policy()
    clock.now = 100.0
    served(p, "a", 1000, 0)
    served(p, "b", 0, 0)
    flows = [flow("a", enqueued_at=50.0), flow("b", enqueued_at=99.0)]  # a has waited far longer
    assert p.pick(flows, {}).fairness_id == "b"  # 0.8 (service) beats 0.2 (wait)
    w, clock2 = policy(lasWeightService=0.1, lasWeightHeadWait=0.9)
    clock2.now = 100.0
    served(w, "a", 1000, 0)
    assert w.pick(flows, {}).fairness_id == "a"
    even, _ = policy()
    assert even.pick([flow("b", 5.0), flow("a", 5.0)], {}).fairness_id == "a"  # a full tie: by fairness id


def test_idle_programs_are_forgotten_after_the_ttl():
    p, clock = policy(evictionTtlSeconds=60, evictionSweepSeconds=10)
    served(p, "idle", 10, 10)
    served(p, "busy", 10, 10)
    clock.now += 61
    p.pick([flow("busy", clock.now)], {})
    assert set(p.programs) == {"busy"}


@pytest.mark.parametrize(
    ("field", "value"),
    [("evictionSweepSeconds", 0), ("lasWeightService", -1), ("lasHalfLifeSeconds", -1), ("strategy", "wfq")],
)
def test_parameters_are_checked_at_load_time(field, value):
    cfg = {"plugins": [{"type": "program-aware-fairness", "parameters": {field: value}}]}
    with pytest.raises(ConfigError, match=field):
        load_config(cfg)


def test_gauges_are_llmds_mean_waits_their_jain_index_and_the_service_at_completion():
    p, clock = policy(lasHalfLifeSeconds=10)
    assert p.gauges() == {("llm_d_epp_program_aware_jains_fairness_index", ()): 1.0}
    clock.now = 100.0
    # a waits 0.3 s then 0.1 s (mean 200 ms), b 0.6 s: each pick stamps its flow head's wait
    assert p.pick([flow("a", 99.7)], {}).fairness_id == "a"
    assert p.pick([flow("a", 99.9)], {}).fairness_id == "a"
    assert p.pick([flow("b", 99.4)], {}).fairness_id == "b"
    served(p, "a", 100, 50)
    clock.now += 10  # decay does not move the gauge: llm-d writes it at a completion
    g = p.gauges()
    assert g[("llm_d_epp_program_aware_avg_wait_time_milliseconds", ("a",))] == pytest.approx(200)
    assert g[("llm_d_epp_program_aware_avg_wait_time_milliseconds", ("b",))] == pytest.approx(600)
    assert g[("llm_d_epp_program_aware_jains_fairness_index", ())] == pytest.approx(800**2 / (2 * (200**2 + 600**2)))
    assert g[("llm_d_epp_program_aware_attained_service_tokens", ("a",))] == 200
    assert ("llm_d_epp_program_aware_attained_service_tokens", ("b",)) not in g
    for i in range(40):  # program ids come from a header: series are capped
        p.pick([flow(f"p{i}", 99.0)], {})
    assert len([k for k in p.gauges() if k[0].endswith("avg_wait_time_milliseconds")]) == 32
