"""Random draws that belong to one scheduling cycle, not to a plugin's lifetime.

A plugin that draws from one generator for its whole life (a picker's tie-break) would be changed
by every run of its profile, even a run whose result is thrown away: the P/D handler's one-round
mode runs the prefill profile beside decode and discards it when the decider says no, and the next
draw would then differ from the sequential rounds. So the loop puts a seed in each cycle's state
(`CYCLE_SEED_KEY`, one draw per request whatever runs), and a plugin draws from a generator made
from that seed and its own salt: a discarded run leaves nothing behind, and the profiles of one
cycle in different actors (different salts) draw independently. Without a seed (a profile run
outside the loop) the plugin's own generator is used, as before. `max-score-picker` (the P/D
configs' picker) draws this way; the random pickers and the LoRA affinity filter still draw from
their own generators, so a stage using them is not draw-for-draw identical in one round."""

from __future__ import annotations

import random
from typing import Protocol

from scheduler.cycle_state import CycleState
from scheduler.loop import CYCLE_SEED_KEY


class DrawsAtRandom(Protocol):
    rng: random.Random  # the fallback generator
    rng_salt: int  # mixed into the cycle seed: independent draws per plugin instance


def salt(rng: random.Random) -> int:
    return rng.getrandbits(64)


def cycle_rng(cycle_state: CycleState, owner: DrawsAtRandom) -> random.Random:
    """The generator `owner` draws from in this cycle (one per cycle and instance: profiles that
    share the instance draw from it in the order they run)."""
    key = f"rng/{id(owner)}"
    rng = cycle_state.read(key)
    if rng is None:
        seed = cycle_state.read(CYCLE_SEED_KEY)
        rng = owner.rng if seed is None else random.Random(seed ^ owner.rng_salt)
        cycle_state.write(key, rng)
    return rng
