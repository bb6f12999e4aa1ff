"""The step-time model (see docs/SIMULATOR.md, "Step time").

One engine step costs
    overhead + prefill_tokens * c_prefill + decode_seqs * c_decode + context_tokens * c_kv
             + adapters_loaded * lora_load
so decode inter-token latency grows with the batch (c_decode, c_kv) and prefill chunks slow the
decodes that share their step. A run of k identical decode-only steps (the batch does not change)
has a closed-form total, which lets the virtual-time driver advance k steps at once.
"""

from __future__ import annotations

import math

from ray_epp.simulator.config import TimingConfig


class StepCost:
    __slots__ = (
        "c_decode", "c_kv", "c_prefill", "cpu_load_per_token", "lora_load", "overhead", "xfer_fixed", "xfer_per_token"
    )

    def __init__(self, t: TimingConfig) -> None:
        self.overhead = t.step_overhead_s
        self.c_prefill = t.prefill_per_token_s
        self.c_decode = t.decode_per_seq_s
        self.c_kv = t.kv_read_per_token_s
        self.lora_load = t.lora_load_s
        self.xfer_fixed = t.kv_transfer_latency_s
        self.xfer_per_token = t.kv_transfer_per_token_s
        self.cpu_load_per_token = t.cpu_load_per_token_s

    def step(self, prefill_tokens: int, decode_seqs: int, context_tokens: int, loads: int) -> float:
        return (
            self.overhead
            + prefill_tokens * self.c_prefill
            + decode_seqs * self.c_decode
            + context_tokens * self.c_kv
            + loads * self.lora_load
        )

    def transfer(self, tokens: int) -> float:
        """Time to pull `tokens` tokens of KV from a prefill pod."""
        return self.xfer_fixed + tokens * self.xfer_per_token

    def cpu_load(self, tokens: int) -> float:
        """Time to load `tokens` tokens of KV from the pod's CPU-offload tier back to the GPU."""
        return tokens * self.cpu_load_per_token

    def decode_run(self, n_seqs: int, context0: int, k: int) -> float:
        """Total time of k decode-only steps of n_seqs sequences; step i reads context0 + i*n_seqs."""
        a = self.overhead + n_seqs * self.c_decode + context0 * self.c_kv
        return k * a + self.c_kv * n_seqs * k * (k - 1) / 2

    def steps_within(self, n_seqs: int, context0: int, budget: float, k_max: int) -> int:
        """Largest k <= k_max (at least 1) whose first k-1 steps end within `budget` seconds.

        The k-th step is the one running when `budget` elapses, so an event at that moment is
        picked up at the end of step k, exactly as with single stepping.
        """
        if k_max <= 1 or budget <= 0:
            return 1
        a = self.overhead + n_seqs * self.c_decode + context0 * self.c_kv
        b = self.c_kv * n_seqs
        if a <= 0 and b <= 0:
            return k_max
        # solve a*j + b*j*(j-1)/2 <= budget for the largest integer j, then k = j + 1
        if b == 0:
            j = int(budget / a)
        else:
            p = a - b / 2
            j = int((-p + math.sqrt(p * p + 2 * b * budget)) / b)
        while j > 0 and self.decode_run(n_seqs, context0, j) > budget:
            j -= 1
        while j + 1 < k_max and self.decode_run(n_seqs, context0, j + 1) <= budget:
            j += 1
        return max(1, min(k_max, j + 1))
