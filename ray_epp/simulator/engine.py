"""The engine model: one vLLM-like model server as a clock-free state machine.

Continuous batching in the manner of vLLM V1's scheduler: each step first gives running requests
their tokens (a decode token, or the next chunk of a chunked prefill) within a per-step token budget
(`max_num_batched_tokens`), preempting the newest running request when KV blocks run out, then
admits waiting requests first-come-first-served while `max_num_seqs`, the budget, KV blocks and
LoRA slots allow. A request whose adapter cannot get a slot is skipped (others may pass it); one
that does not fit in the KV cache blocks the queue behind it.

The engine never reads a clock. A driver calls `begin_step(now)` to plan a step (it returns the
step's end time), waits until then in its own notion of time, and calls `finish_step()` to apply it.
The HTTP driver does this in real time, the cluster simulation in virtual time. When the batch is
decode-only and cannot change, `begin_step(now, max_steps=k)` plans up to k steps at once (the
result is the same as k single steps); `truncate(now)` shortens such a run when a request arrives.

With KV events on (`cfg.kv_events`, or `enable_kv_events()`), blocks are keyed as vLLM keys them
(the prompt's token ids through `kvevents.BlockHasher` with the pod's hash algorithm and seed), and
the cache's changes collect as vLLM's events — `BlockStored` when a full block is cached,
`BlockRemoved` when one is evicted, `AllBlocksCleared` on `reset_prefix_cache()` — which the driver
takes with `take_kv_events()` after each `begin_step` / `finish_step`. Off, the keys are Python's
built-in hash of the prompt's blocks, the cheapest there is.

With a CPU-offload tier (`cfg.cpu_offload_blocks`, ray_epp.simulator.cpu_tier) evicted blocks move
to host memory; a request whose GPU hit continues there loads them back to the GPU, waiting
`cpu_load_per_token_s` a token without stalling the batch (as a P/D pull waits).

A request and its states: `engine_request.py`; what a request is made of before it queues (its
model, prompt, admission errors, block hashes): `engine_intake.py`, a base of `Engine`.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from ray_epp.kvevents import MEDIUM_CPU, BlockHasher, BlockRemoved, KVEvent
from ray_epp.simulator.config import PodConfig
from ray_epp.simulator.cpu_tier import CpuTier
from ray_epp.simulator.engine_intake import RequestIntake
from ray_epp.simulator.engine_request import ABORTED, FINISHED, RUNNING, TRANSFERRING, WAITING, EngineRequest
from ray_epp.simulator.kv_cache import KVCache
from ray_epp.simulator.lora import LoraSlots
from ray_epp.simulator.timing import StepCost
from ray_epp.simulator.tokenizer import PodTokenizer, pod_tokenizer
from ray_epp.simulator.tokens import vllm_hasher


class Engine(RequestIntake):
    """The model of one model server (see module docstring)."""

    def __init__(self, cfg: PodConfig, seed: int = 0) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.engine_id = f"{cfg.name}-{seed}"
        self.block_size = cfg.block_size
        self.max_num_seqs = cfg.max_num_seqs
        self.max_batched = cfg.max_num_batched_tokens
        self.kv = KVCache(cfg.num_gpu_blocks, cfg.block_size, cfg.enable_prefix_caching)
        if cfg.cpu_offload_blocks:
            self.kv.cpu = CpuTier(cfg.cpu_offload_blocks, cfg.block_size)
        self.hasher: BlockHasher | None = None
        self.tokenizer: PodTokenizer | None = pod_tokenizer(cfg.tokenizer) if cfg.tokenizer else None
        if cfg.kv_events:
            self.enable_kv_events()
        self.lora = LoraSlots(cfg.max_loras)
        self.cost = StepCost(cfg.timing)
        self.adapters: dict[str, str] = {a: f"/adapters/{a}" for a in cfg.lora_adapters}
        self.rng = random.Random(f"{cfg.seed if cfg.seed is not None else seed}:{cfg.name}")
        self.waiting: deque[EngineRequest] = deque()
        self.transferring: list[EngineRequest] = []
        self.running: list[EngineRequest] = []
        self._sched: list[EngineRequest] = []
        self.track_emitted = False
        self.emitted: list[EngineRequest] = []
        # Requests whose first token came in the last step (kept for cluster routers that track prefill).
        self.first_tokens: list[EngineRequest] = []
        self.in_flight = False
        self.step_start = 0.0
        self.step_end = 0.0
        self._k = 1
        self._macro_n = 0
        self._macro_ctx0 = 0
        self.version = 0  # bumped on every state change; lets scrapers skip unchanged pods
        # counters (vLLM's Prometheus counters read these)
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.cpu_loaded_tokens = 0  # prompt tokens loaded from the CPU tier instead of computed
        self.preemptions = 0
        self.steps = 0
        self.busy_time = 0.0
        self.finished_by_reason: dict[str, int] = {}

    # ---- KV events ------------------------------------------------------------------------
    def enable_kv_events(self) -> None:
        """Key blocks as vLLM does and collect the cache's events (before any request arrives)."""
        if self.hasher is None:
            self.hasher = vllm_hasher(self.block_size, self.cfg.prefix_caching_hash_algo, self.cfg.hash_seed)
            self.kv.events = []

    def take_kv_events(self) -> list[KVEvent]:
        """The events since the last call (empty when events are off)."""
        events = self.kv.events
        if not events:
            return []
        self.kv.events = []
        return events

    def reset_prefix_cache(self) -> bool:
        """vLLM's /reset_prefix_cache: forget every cached block (an AllBlocksCleared); as in vLLM,
        refused (False) while a request holds blocks."""
        if self.kv.num_used:
            return False
        self.kv.clear()
        self.version += 1
        return True

    # ---- requests (built by RequestIntake) ------------------------------------------------
    def add(self, r: EngineRequest) -> None:
        r.state = WAITING
        r.prefill_len = r.prompt_tokens
        self.waiting.append(r)
        self.prompt_tokens_total += r.prompt_tokens
        self.version += 1

    def abort(self, r: EngineRequest) -> None:
        """Drop a request (client gone); frees its blocks and adapter slot."""
        if r.state == WAITING:
            self.waiting.remove(r)
        elif r.state == TRANSFERRING:
            self.transferring.remove(r)
            self._free(r)
        elif r.state == RUNNING:
            self.running.remove(r)
            self._free(r)
        else:
            return
        r.state = ABORTED
        self.finished_by_reason["abort"] = self.finished_by_reason.get("abort", 0) + 1
        self.version += 1

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.transferring)

    def next_timer(self) -> float | None:
        """When an idle engine needs attention again without new input (a KV pull completing)."""
        return min(r.ready_time for r in self.transferring) if self.transferring else None

    # ---- stepping -------------------------------------------------------------------------
    def begin_step(self, now: float, max_steps: int = 1) -> float | None:
        """Plan the next step at `now`; returns its end time, or None when nothing can run now."""
        assert not self.in_flight, "finish_step() must follow begin_step()"
        if self.transferring:
            self._promote(now)
        kv, bs, running = self.kv, self.block_size, self.running
        budget = self.max_batched
        sched = self._sched
        sched.clear()
        prefill_tokens = decode_seqs = ctx = loads = 0
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            comp = r.num_computed
            n = 1 if comp >= r.prefill_len else min(r.prefill_len - comp, budget)
            need = (comp + n + bs - 1) // bs - len(r.blocks)
            if need > 0:
                got = kv.allocate(need)
                while got is None:
                    victim = running.pop()
                    self._preempt(victim)
                    preempted = True
                    if victim is r:
                        break
                    got = kv.allocate(need)
                if got is None:
                    break
                r.blocks.extend(got)
            r.sched_tokens = n
            sched.append(r)
            budget -= n
            if comp < r.prefill_len:
                prefill_tokens += n
                self._register(r, comp + n)
            else:
                decode_seqs += 1
            ctx += comp + n
            i += 1
        admitted = 0
        if self.waiting and not preempted:
            admitted, budget, p_tok, p_ctx, loads = self._admit(now, budget)
            prefill_tokens += p_tok
            ctx += p_ctx
        if not sched:
            if admitted:
                self.version += 1
            return None
        k = 1
        if (
            max_steps > 1
            and prefill_tokens == 0
            and loads == 0
            and not preempted
            and not admitted
            and len(sched) == len(running)
        ):
            k = self._plan_run(now, max_steps, ctx)
        if k > 1:
            duration = self.cost.decode_run(len(sched), ctx, k)
        else:
            duration = self.cost.step(prefill_tokens, decode_seqs, ctx, loads)
        self._k = k
        self._macro_n = len(sched)
        self._macro_ctx0 = ctx
        self.in_flight = True
        self.step_start = now
        self.step_end = now + duration
        self.version += 1
        return self.step_end

    def truncate(self, now: float) -> float:
        """Cut an in-flight multi-step run short so that it ends with the step running at `now`."""
        if self.in_flight and self._k > 1:
            k = self.cost.steps_within(self._macro_n, self._macro_ctx0, now - self.step_start, self._k)
            if k < self._k:
                self._k = k
                self.step_end = self.step_start + self.cost.decode_run(self._macro_n, self._macro_ctx0, k)
        return self.step_end

    def finish_step(self) -> list[EngineRequest]:
        """Apply the in-flight step at its end time; returns the requests that finished."""
        assert self.in_flight
        self.in_flight = False
        end, k = self.step_end, self._k
        finished: list[EngineRequest] = []
        emitted = self.emitted
        track = self.track_emitted
        if track:
            emitted.clear()
        firsts = self.first_tokens
        if firsts:
            firsts.clear()
        bs = self.block_size
        tokens = 0
        for r in self._sched:
            if r.state != RUNNING:
                continue  # aborted during the step
            if r.num_computed < r.prefill_len:
                r.num_computed += r.sched_tokens
                if r.num_computed < r.prefill_len:
                    continue
                r.num_output += 1
                tokens += 1
                if r.first_token_time < 0:
                    r.first_token_time = end
                    firsts.append(r)
            else:
                r.num_computed += k
                r.num_output += k
                tokens += k
                if k > 1:
                    need = (r.num_computed + bs - 1) // bs - len(r.blocks)
                    if need > 0:
                        got = self.kv.allocate(need)
                        assert got is not None, "multi-step run planned without enough free blocks"
                        r.blocks.extend(got)
            if track:
                emitted.append(r)
            if r.num_output >= r.output_len:
                self._finish(r, end)
                finished.append(r)
        if finished:
            self.running = [r for r in self.running if r.state == RUNNING]
        self.generation_tokens_total += tokens
        self.steps += k
        self.busy_time += end - self.step_start
        self.version += 1
        return finished

    # ---- metrics --------------------------------------------------------------------------
    def waiting_adapters(self) -> list[str]:
        out = dict.fromkeys(r.lora for r in self.waiting if r.lora is not None)
        return list(out)

    def snapshot(self) -> dict[str, Any]:
        """The pod's metrics in DESIGN.md's JSON form, as a scraper of vLLM's /metrics would map them."""
        return {
            "waiting_queue_size": len(self.waiting) + len(self.transferring),
            "running_requests_size": len(self.running),
            "kv_cache_usage_percent": self.kv.usage(),
            "active_models": self.lora.running_adapters(),
            "waiting_models": self.waiting_adapters(),
            "max_active_models": self.lora.max_loras,
            "cache_block_size": self.block_size,
            "cache_num_gpu_blocks": self.kv.num_blocks,
        }

    # ---- internals ------------------------------------------------------------------------
    def _admit(self, now: float, budget: int) -> tuple[int, int, int, int, int]:
        """Admit waiting requests FCFS; returns (admitted, budget left, prefill tokens, context, loads)."""
        kv, lora, bs = self.kv, self.lora, self.block_size
        waiting, running, sched = self.waiting, self.running, self._sched
        skipped: list[EngineRequest] = []
        admitted = prefill_tokens = ctx = loads = 0
        while waiting and budget > 0 and len(running) + len(self.transferring) < self.max_num_seqs:
            r = waiting[0]
            if r.lora is not None and not lora.can_admit(r.lora):
                skipped.append(waiting.popleft())
                continue
            r.prefill_len = r.prompt_tokens + r.num_output
            hits = kv.match_prefix(r.block_hashes, (r.prefill_len - 1) // bs)
            hit_tokens = len(hits) * bs
            cpu_stop = (r.prefill_len - 1) // bs  # CPU blocks that continue the GPU hit are loaded
            loaded = 0 if kv.cpu is None or r.remote_prefill else kv.cpu.match(r.block_hashes, len(hits), cpu_stop)
            if loaded or r.remote_prefill:
                n_new = 0
                target = hit_tokens + loaded * bs if loaded else max(hit_tokens, r.prefill_len - 1)
            else:
                n_new = min(r.prefill_len - hit_tokens, budget)
                target = hit_tokens + n_new
            need = (target + bs - 1) // bs - len(hits)
            if need > kv.num_free - kv.evictable_count(hits):
                break
            waiting.popleft()
            if r.lora is not None and lora.admit(r.lora) == 1:
                loads += 1
                r.lora_loaded = True
            kv.acquire(hits)
            if loaded:  # off the CPU tier before allocating, so no eviction pushes them out
                kv.cpu.take(r.block_hashes[len(hits) : len(hits) + loaded])  # type: ignore[union-attr]
            got = kv.allocate(need) if need > 0 else []
            assert got is not None
            r.blocks = hits + got
            r.n_hashed = len(hits)
            self.prefix_queries += r.prompt_tokens
            self.prefix_hits += hit_tokens
            if r.first_scheduled < 0:
                r.first_scheduled = now
            admitted += 1
            if loaded:
                self._load_from_cpu(r, now, target, loaded)
                continue
            if r.remote_prefill:
                if r.num_cached_tokens < 0:
                    r.num_cached_tokens = target
                r.num_computed = target
                self._register(r, target)
                r.state = TRANSFERRING
                r.ready_time = now + self.cost.transfer(target - hit_tokens)
                self.transferring.append(r)
                continue
            if r.num_cached_tokens < 0:
                r.num_cached_tokens = hit_tokens
            r.num_computed = hit_tokens
            r.state = RUNNING
            r.sched_tokens = n_new
            running.append(r)
            sched.append(r)
            budget -= n_new
            prefill_tokens += n_new
            ctx += target
            self._register(r, target)
        if skipped:
            waiting.extendleft(reversed(skipped))
        return admitted, budget, prefill_tokens, ctx, loads

    def _load_from_cpu(self, r: EngineRequest, now: float, target: int, loaded: int) -> None:
        """Its CPU blocks are back on the GPU (stored there, then off the CPU): it waits, then prefills."""
        r.num_cached_tokens = target if r.num_cached_tokens < 0 else r.num_cached_tokens
        r.num_computed, end = target, target // self.block_size
        self._register(r, target)
        if self.kv.events is not None:
            self.kv.events.append(BlockRemoved(r.block_hashes[end - loaded : end], medium=MEDIUM_CPU))
        self.cpu_loaded_tokens += loaded * self.block_size
        r.state = TRANSFERRING
        r.ready_time = now + self.cost.cpu_load(loaded * self.block_size)
        self.transferring.append(r)

    def _plan_run(self, now: float, max_steps: int, ctx0: int) -> int:
        """How many identical decode steps can run before the batch would change."""
        sched = self._sched
        k = min(max_steps, min(r.output_len - r.num_output for r in sched))
        if k > 1 and self.transferring:
            horizon = min(r.ready_time for r in self.transferring) - now
            k = self.cost.steps_within(len(sched), ctx0, horizon, k)
        if k <= 1:
            return 1
        free, bs = self.kv.num_free, self.block_size

        def extra_blocks(steps: int) -> int:
            return sum(max(0, (r.num_computed + steps + bs - 1) // bs - len(r.blocks)) for r in sched)

        if extra_blocks(k) <= free:
            return k
        lo, hi = 1, k  # lo is feasible (extra_blocks(1) == 0), hi is not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if extra_blocks(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def _promote(self, now: float) -> None:
        ready = [r for r in self.transferring if r.ready_time <= now]
        if ready:
            self.transferring = [r for r in self.transferring if r.ready_time > now]
            for r in ready:
                r.state = RUNNING
                self.running.append(r)

    def _register(self, r: EngineRequest, upto_tokens: int) -> None:
        nb = min(len(r.block_hashes), upto_tokens // self.block_size)
        if nb > r.n_hashed:
            cache_block, blocks, hashes = self.kv.cache_block, r.blocks, r.block_hashes
            if self.kv.events is None:
                for i in range(r.n_hashed, nb):
                    cache_block(blocks[i], hashes[i])
            else:
                self.kv.cache_blocks_with_events(blocks, hashes, r.token_ids, r.n_hashed, nb, r.lora)
            r.n_hashed = nb

    def _free(self, r: EngineRequest) -> None:
        self.kv.release(r.blocks)
        r.blocks = []
        if r.lora is not None:
            self.lora.release(r.lora)

    def _preempt(self, r: EngineRequest) -> None:
        """vLLM's recompute preemption: free everything, back to the head of the waiting queue."""
        self._free(r)
        r.state = WAITING
        r.num_computed = 0
        r.n_hashed = 0
        r.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(r)

    def _finish(self, r: EngineRequest, t: float) -> None:
        r.state = FINISHED
        r.finish_time = t
        reason = "length" if r.num_output >= r.max_tokens else "stop"
        r.finish_reason = reason
        self.finished_by_reason[reason] = self.finished_by_reason.get(reason, 0) + 1
        if r.remote_decode:
            r.kv_blocks_out = list(r.blocks)
        self._free(r)
