"""The profile actor's event log: what a router gets back for its epoch and cursor."""

from __future__ import annotations

import pytest

from actors.event_log import EventLog
from actors.protocol import ProfileEvent
from scheduler import LLMRequest
from scheduler.lifecycle import LifecycleEvent


def event(i: int) -> ProfileEvent:
    return ProfileEvent(LifecycleEvent.RESPONSE_COMPLETE, LLMRequest(f"r{i}", "m", {}), endpoint_name="e")


def filled(limit: int = 4) -> EventLog:
    log = EventLog(limit)
    for i, origin in enumerate(["a", "b", "a", "b", "b", "a"]):  # seq 1..6; the last 4 kept
        log.append(origin, event(i))
    return log


def ids(page) -> list[str]:
    return [e.request.request_id for e in page.events]


@pytest.mark.parametrize(
    ("origin", "epoch", "cursor", "want_ids", "want_reset"),
    [
        ("a", "same", 4, ["r4"], False),  # b's events after 4, not a's own
        ("b", "same", 4, ["r5"], False),
        ("a", "same", 6, [], False),  # up to date
        ("a", "same", 2, ["r3", "r4"], False),  # the oldest kept is seq 3: nothing missed
        ("a", "same", 1, ["r2", "r3", "r4", "r5"], True),  # seq 2 fell out: rebuild from what is kept
        ("a", None, 0, ["r2", "r3", "r4", "r5"], True),  # first sync: all kept, own included
        ("a", "other", 5, ["r2", "r3", "r4", "r5"], True),  # the actor restarted
        ("a", "same", 9, ["r2", "r3", "r4", "r5"], True),  # a cursor from the future: another log
    ],
)
def test_a_page_is_the_others_events_since_the_cursor(origin, epoch, cursor, want_ids, want_reset):
    log = filled()
    page = log.page(origin, log.epoch if epoch == "same" else epoch, cursor)
    assert (ids(page), page.reset, page.cursor, page.epoch) == (want_ids, want_reset, 6, log.epoch)


def test_a_long_way_behind_comes_in_pages():
    log = EventLog(100)
    for i in range(10):
        log.append("b", event(i))
    first = log.page("a", log.epoch, 0, limit=4)
    assert (ids(first), first.more, first.cursor) == (["r0", "r1", "r2", "r3"], True, 4)
    second = log.page("a", log.epoch, first.cursor, limit=4)
    third = log.page("a", log.epoch, second.cursor, limit=4)
    assert ids(second) + ids(third) == [f"r{i}" for i in range(4, 10)] and not third.more
    assert not first.reset and not second.reset


def test_a_new_log_has_its_own_epoch():
    assert EventLog().epoch != EventLog().epoch
