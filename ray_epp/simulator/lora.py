"""LoRA adapter slots: at most `max_loras` adapters resident on the GPU at once.

A request for a resident adapter runs at once. A request for another adapter takes a free slot or
evicts the least recently used resident adapter that no running request uses; activating it adds
the load time to that engine step (vLLM loads adapters inside the step, stalling the whole batch).
When every slot is pinned by running requests the request waits.
"""

from __future__ import annotations

from collections import OrderedDict


class LoraSlots:
    __slots__ = ("in_use", "loads", "max_loras", "resident")

    def __init__(self, max_loras: int) -> None:
        self.max_loras = max_loras
        self.resident: OrderedDict[str, None] = OrderedDict()  # LRU order, most recent last
        self.in_use: dict[str, int] = {}  # adapter -> running requests using it
        self.loads = 0

    def can_admit(self, name: str) -> bool:
        """Whether `admit(name)` would succeed (resident, a free slot, or an evictable adapter)."""
        if name in self.resident or len(self.resident) < self.max_loras:
            return True
        return any(not self.in_use.get(a) for a in self.resident)

    def admit(self, name: str) -> int:
        """Reserve a slot for one more running request of `name`.

        Returns 0 if the adapter was resident, 1 if it was loaded now (the caller pays the load
        time), -1 if no slot can be had (nothing changed; the request must wait).
        """
        resident = self.resident
        if name in resident:
            resident.move_to_end(name)
            self.in_use[name] = self.in_use.get(name, 0) + 1
            return 0
        if len(resident) >= self.max_loras:
            victim = next((a for a in resident if not self.in_use.get(a)), None)
            if victim is None:
                return -1
            del resident[victim]
            self.in_use.pop(victim, None)
        resident[name] = None
        self.in_use[name] = 1
        self.loads += 1
        return 1

    def release(self, name: str) -> None:
        self.in_use[name] -= 1

    def running_adapters(self) -> list[str]:
        return [a for a, n in self.in_use.items() if n > 0]

    def drop(self, name: str) -> bool:
        """Unload an adapter that no running request uses (the /v1/unload_lora_adapter path)."""
        if self.in_use.get(name):
            return False
        self.resident.pop(name, None)
        self.in_use.pop(name, None)
        return True
