"""The joint placement of a burst window, as a table: llm-d's assign_test.go cases (burstprefix at
ebab6879), each written as the replicas every unit's members land on."""

from __future__ import annotations

import pytest

from scheduler.plugins.support.burst_assign import UNLIMITED, BurstEntry, assign
from tests.scheduler.helpers import endpoint

FAM = tuple(range(1, 10))  # a 9-block shared leading prefix

# (case, replicas, units as (members, block hashes), k, minColocateBlocks, by tokens, expected)
CASES = [
    ("unlimited k co-locates a whole group", 4, [(8, (1, 2, 3))], UNLIMITED, 0, False,
     ["pod1 " * 8]),
    ("k=2 spreads 8 samples 2 a replica", 4, [(8, (1, 2, 3))], 2, 0, False,
     ["pod1 pod1 pod2 pod2 pod3 pod3 pod4 pod4"]),
    ("k=4 fills a replica before spilling", 4, [(8, (1, 2, 3))], 4, 0, False,
     ["pod1 " * 4 + "pod2 " * 4]),
    ("a singleton gets no affinity", 2, [(1, (1, 2, 3))], UNLIMITED, 0, False, ["None"]),
    ("prefix-less requests are never grouped", 2, [(2, ())], UNLIMITED, 0, False, ["None None"]),
    ("distinct groups spread", 4, [(8, (1, 2, 3)), (8, (9, 9, 9))], UNLIMITED, 0, False,
     ["pod1 " * 8, "pod2 " * 8]),
    ("prefix families co-locate within the fair share", 2,
     [(2, (1, 2, 3)), (2, (1, 2, 4)), (2, (7, 8, 5)), (2, (7, 8, 6))], UNLIMITED, 2, False,
     ["pod1 pod1", "pod1 pod1", "pod2 pod2", "pod2 pod2"]),
    ("the fair share spreads one family over all replicas", 4,
     [(2, (1, 2, 3)), (2, (1, 2, 4)), (2, (1, 2, 5)), (2, (1, 2, 6))], UNLIMITED, 2, False,
     ["pod1 pod1", "pod2 pod2", "pod3 pod3", "pod4 pod4"]),
    ("a sharing singleton attaches to its group", 2,
     [(2, (1, 2, 3)), (1, (1, 2, 8)), (2, (7, 8, 5)), (1, (7, 8, 9))], UNLIMITED, 2, False,
     ["pod1 pod1", "pod1", "pod2 pod2", "pod2"]),
    ("a lone singleton keeps no affinity", 2, [(2, (1, 2, 3)), (1, (5, 5, 5))], UNLIMITED, 2, False,
     ["pod1 pod1", "None"]),
    ("overlapping singletons co-locate, balanced", 2,
     [(1, (1, 2, 3)), (1, (1, 2, 4)), (1, (1, 2, 5)), (1, (1, 2, 6))], UNLIMITED, 2, False,
     ["pod1", "pod1", "pod2", "pod2"]),
    ("a shared prefix below the threshold is placed by load", 2,
     [(2, (1, 2, 3)), (2, (1, 2, 4)), (2, (7, 8, 5)), (2, (7, 8, 6))], UNLIMITED, 3, False,
     ["pod1 pod1", "pod2 pod2", "pod1 pod1", "pod2 pod2"]),
    ("one replica takes everything", 1, [(4, (1, 2, 3)), (4, (9, 9, 9))], UNLIMITED, 2, False,
     ["pod1 " * 4, "pod1 " * 4]),
    ("by requests a short unit joins the long one", 2, [(2, (1, 2, 3, 4)), (2, (5,)), (2, (6,))],
     UNLIMITED, 0, False, ["pod1 pod1", "pod2 pod2", "pod1 pod1"]),
    ("by tokens the long unit stays alone", 2, [(2, (1, 2, 3, 4)), (2, (5,)), (2, (6,))],
     UNLIMITED, 0, True, ["pod1 pod1", "pod2 pod2", "pod2 pod2"]),
    ("by tokens a shared prefix is charged once", 2,
     [(2, (*FAM, 10)), (2, (*FAM, 11)), (2, (*FAM, 12))], UNLIMITED, 9, True,
     ["pod1 pod1", "pod1 pod1", "pod1 pod1"]),
    ("past k x replicas members rebalance one by one", 2, [(8, (1, 2, 3))], 2, 0, False,
     ["pod1 pod1 pod2 pod2 pod1 pod2 pod1 pod2"]),
]  # fmt: skip


@pytest.mark.parametrize(("case", "replicas", "units", "k", "min_blocks", "by_tokens", "expected"), CASES)
def test_assign(case, replicas, units, k, min_blocks, by_tokens, expected):
    pods = [endpoint(f"pod{i + 1}") for i in range(replicas)]
    groups = [[BurstEntry(list(hashes), pods) for _ in range(n)] for n, hashes in units]
    assign([e for g in groups for e in g], k, min_blocks, by_tokens)
    assert [" ".join(str(e.assigned) for e in g) for g in groups] == [x.strip() for x in expected], case


def test_running_requests_break_a_load_tie():
    pods = [endpoint("pod1", running_requests_size=5), endpoint("pod2")]
    group = [BurstEntry([1, 2], pods) for _ in range(3)]
    assign(group, UNLIMITED, 0, False)
    assert {e.assigned for e in group} == {"pod2"}
