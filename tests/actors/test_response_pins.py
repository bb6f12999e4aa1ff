"""The Responses API's pins (response id → pod): bounded, each forgotten after its time to live."""

from __future__ import annotations

from actors.response_pins import ResponsePins


def test_pins_expire_and_the_oldest_go_first() -> None:
    now = [0.0]
    pins = ResponsePins(max_pins=2, ttl_s=10.0, clock=lambda: now[0])
    pins.pin("r1", "pod-a")
    pins.pin("r2", "pod-b")
    assert pins.pod_of("r1") == "pod-a"
    pins.pin("r3", "pod-c")  # over the bound: r1, the oldest pinned, goes
    assert pins.pod_of("r1") is None and pins.pod_of("r2") == "pod-b" and len(pins) == 2
    now[0] = 10.0
    assert pins.pod_of("r2") is None and len(pins) == 1
    pins.forget("r3")
    assert pins.pod_of("r3") is None and len(pins) == 0
