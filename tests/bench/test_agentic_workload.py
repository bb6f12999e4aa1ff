"""The agentic workload (bench/workloads/agentic.py): tool-call sessions whose prompts grow turn by
turn on a system prompt shared per agent type, short outputs but the final answer, open-loop
arrivals at the asked rate, never past the pods' context limit, and the same requests per seed."""

from __future__ import annotations

import copy
import itertools
from collections import defaultdict

from bench.policies import make_policy
from bench.scenarios import SCENARIOS
from bench.workloads import AgenticSpec, agentic_workload
from ray_epp.simulator import make_pod_configs, run_cluster_sim

SPEC = AgenticSpec(num_requests=800)


def by_session(requests):
    out = defaultdict(list)
    for r in requests:
        out[r.headers["x-session-id"]].append(r)
    return out


def test_each_turn_is_the_last_turns_conversation_and_more():
    sessions = by_session(agentic_workload(20.0, seed=1, spec=SPEC))
    assert len(sessions) > 20
    for turns in sessions.values():
        for before, after in itertools.pairwise(turns):
            assert after.arrival_time > before.arrival_time
            sent = before.body["messages"]
            assert after.body["messages"][: len(sent)] == sent  # the same conversation, grown
            assert [m["role"] for m in after.body["messages"][len(sent):]] == ["assistant", "tool"]
            assert before.max_tokens <= SPEC.tool_call_tokens[1]  # a tool call: short


def test_sessions_of_one_agent_type_share_its_system_prompt():
    systems = defaultdict(set)
    for r in agentic_workload(20.0, seed=2, spec=SPEC):
        systems[r.headers["x-agent-type"]].add(r.body["messages"][0]["content"])
    assert len(systems) == SPEC.agent_types and all(len(s) == 1 for s in systems.values())


def test_the_rate_is_kept_and_the_context_limit_is_never_passed():
    requests = agentic_workload(40.0, seed=3, spec=AgenticSpec(num_requests=2000))
    span = requests[-1].arrival_time - requests[0].arrival_time
    assert 0.85 < len(requests) / span / 40.0 < 1.15
    assert max(r.prompt_tokens + r.max_tokens for r in requests) <= SPEC.max_total_tokens
    assert any(r.prompt_tokens > 5000 for r in requests)  # the long-context sessions


def test_the_same_seed_gives_the_same_requests():
    a, b = agentic_workload(20.0, seed=4, spec=SPEC), agentic_workload(20.0, seed=4, spec=SPEC)
    assert [(r.arrival_time, r.body) for r in a] == [(r.arrival_time, r.body) for r in b]
    assert agentic_workload(20.0, seed=5, spec=SPEC)[0].body != a[0].body


def test_it_runs_in_the_cluster_simulation_with_every_policy_of_its_scenario():
    scenario = SCENARIOS["agentic"]
    workload = agentic_workload(4.0, seed=6, spec=AgenticSpec(num_requests=120))
    for policy in scenario.policies:
        report = run_cluster_sim(make_pod_configs(2), copy.deepcopy(workload), make_policy(policy, seed=0))
        assert report.completed == len(report.results) == len(workload), policy
        assert report.prefix_hit_rate > 0.5, policy  # the growing conversations hit the cache
