"""Driver 2: N pods of the same engine model in virtual time, routed by any callable.

A discrete-event loop (a heap of step ends, KV-pull timers and scrapes; arrivals merged from the
sorted workload) — no asyncio, no sleeping. Each arrival is handed to the router together with the
pods' metrics as a scraper polling every `scrape_interval` seconds last saw them (each pod scraped
at its own seeded phase), so routing on stale metrics has its real consequences. A router may
answer a pod name, None (shed the request), or a (prefill_pod, decode_pod) pair: the prefill pod
runs the prompt, the decode pod pulls the KV (paying the transfer time) and generates.

A router with a queue (flow control) may answer `HOLD`: it keeps the request and hands it back
later from `poll(pods, now)`, a list of (request, decision) pairs, which the simulation calls
after every event while the router holds requests, and at the time `next_poll()` names (e.g.
the oldest request's TTL). A held request's times (TTFT, queue wait) count from its arrival.
What a router is handed and may answer: `routing.py`.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ray_epp.kvevents import KVEventBatch
from ray_epp.simulator.config import PodConfig
from ray_epp.simulator.engine import Engine, EngineRequest
from ray_epp.simulator.report import DROPPED, OK, REJECTED, PodStats, RequestResult, SimReport
from ray_epp.simulator.routing import (
    HOLD,
    CompleteFn,
    FirstTokenFn,
    KVEventsFn,
    PodView,
    PollFn,
    RouteDecision,
    RouteFn,
    Router,
    SimRequest,
)
from ray_epp.simulator.tokens import Prompt, count_tokens


@dataclass(slots=True)
class _Flight:
    """The simulation's per-request state, attached to engine requests as their sink."""

    req: SimRequest
    decode: int
    prefill: int = -1  # pod index of the prefill half, -1 when not split
    prefill_er: EngineRequest | None = None


_STEP, _TIMER, _SCRAPE, _WAKE = 0, 1, 2, 3


class ClusterSim:
    """Run a workload through pods in virtual time: `ClusterSim(pods, router).run(workload)`."""

    def __init__(
        self,
        pods: Sequence[PodConfig] | int,
        router: Router | RouteFn,
        *,
        scrape_interval: float = 0.05,
        seed: int = 0,
        max_steps: int = 4096,
        on_complete: CompleteFn | None = None,
        on_first_token: FirstTokenFn | None = None,
        on_kv_events: KVEventsFn | None = None,
    ) -> None:
        configs = [PodConfig(name=f"sim-{i}") for i in range(pods)] if isinstance(pods, int) else list(pods)
        if not configs:
            raise ValueError("at least one pod is needed")
        self.configs = configs
        self.route: RouteFn = router.route if isinstance(router, Router) else router
        self.on_complete = on_complete or getattr(router, "on_complete", None)
        # Called when a request's first token reaches the client (from the decode pod, under P/D).
        self.on_first_token = on_first_token or getattr(router, "on_first_token", None)
        self.poll: PollFn | None = getattr(router, "poll", None)  # routers that may answer HOLD
        self.next_poll: Callable[[], float] | None = getattr(router, "next_poll", None)
        self.scrape_interval = scrape_interval
        self.seed = seed
        self.max_steps = max_steps
        self.engines = [Engine(c, seed) for c in configs]
        # Each pod's KV events (vLLM's, as its ZMQ publisher would send them), delivered in-process.
        self.on_kv_events = on_kv_events or getattr(router, "on_kv_events", None)
        if self.on_kv_events is not None:
            for e in self.engines:
                e.enable_kv_events()
        self.index = {c.name: i for i, c in enumerate(configs)}
        if len(self.index) != len(configs):
            raise ValueError("pod names must be unique")
        self.views = [PodView(c.name, c.all_labels(), e.snapshot()) for c, e in zip(configs, self.engines, strict=True)]
        self.now = 0.0

    def run(self, workload: Iterable[SimRequest]) -> SimReport:
        wall0 = time.perf_counter()
        run = _Run(self, sorted(workload, key=lambda r: r.arrival_time))
        run.loop()
        return run.report(time.perf_counter() - wall0)

    def pod_index(self, name: str) -> int:
        try:
            return self.index[name]
        except KeyError:
            raise ValueError(f"router returned unknown pod {name!r}") from None


class _Run:
    """One run of the event loop: the heap of events, per-pod step and timer bookkeeping, results.

    Events are (time, sequence, kind, pod, version); the sequence number keeps equal times in the
    order they were pushed. A step event whose version is older than its pod's `step_ver` was
    superseded (an arrival cut the step short) and is ignored. A pod that changed ("dirty") starts
    its next step only once every event at the current time is in, so that arrivals and step ends
    at the same instant join the same batch."""

    __slots__ = (
        "arrivals", "dirty", "engines", "heap", "held", "interval", "is_dirty", "live", "next_arrival",
        "outstanding", "requests_per_pod", "results", "scraped_ver", "seq", "sim", "step_ver", "timer_at", "views",
        "wake_at",
    )  # fmt: skip

    def __init__(self, sim: ClusterSim, arrivals: list[SimRequest]) -> None:
        n = len(sim.engines)
        self.sim = sim
        self.engines = sim.engines
        self.views = sim.views
        self.arrivals = arrivals
        self.next_arrival = 0  # index into arrivals
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = itertools.count()
        self.step_ver = [0] * n
        self.timer_at = [math.nan] * n
        self.scraped_ver = [-1] * n
        self.requests_per_pod = [0] * n
        self.dirty: list[int] = []
        self.is_dirty = [False] * n
        self.results: list[RequestResult] = []
        self.outstanding = 0  # admitted requests not finished yet
        self.held = 0  # requests the router answered HOLD for and has not handed back
        self.wake_at = math.inf  # the _WAKE event in the heap for the router's next_poll
        self.live = 0  # step and timer events in the heap; none left with requests outstanding = stuck
        self.interval = sim.scrape_interval
        if self.interval > 0:
            rng = random.Random(f"scrape:{sim.seed}")
            t0 = arrivals[0].arrival_time if arrivals else 0.0
            for i in range(n):
                self._push(t0 + rng.random() * self.interval, _SCRAPE, i)

    # -- the loop

    def loop(self) -> None:
        while self.next_arrival < len(self.arrivals) or self.outstanding > 0 or self.held > 0:
            t_arr = self._next_arrival_time()
            t_ev = self.heap[0][0] if self.heap else math.inf
            if t_arr == math.inf and t_ev == math.inf:
                break
            if t_ev <= t_arr:
                now = self._handle_event()
            else:
                now = self.sim.now = t_arr
                self._arrive(self.arrivals[self.next_arrival], now)
                self.next_arrival += 1
            if self.held:
                self._poll(now)
            next_time = min(self.heap[0][0] if self.heap else math.inf, self._next_arrival_time())
            if self.dirty and next_time > now:  # every event at `now` is in: start the steps
                self._start_steps(now)
                self._check_stalled()

    def _next_arrival_time(self) -> float:
        return self.arrivals[self.next_arrival].arrival_time if self.next_arrival < len(self.arrivals) else math.inf

    def _push(self, t: float, kind: int, i: int, ver: int = 0) -> None:
        if kind != _SCRAPE:
            self.live += 1
        heapq.heappush(self.heap, (t, next(self.seq), kind, i, ver))

    def _mark(self, i: int) -> None:
        if not self.is_dirty[i]:
            self.is_dirty[i] = True
            self.dirty.append(i)

    def _handle_event(self) -> float:
        now, _, kind, i, ver = heapq.heappop(self.heap)
        self.sim.now = now
        if kind == _SCRAPE:
            self._scrape(i, now)
            return now
        if kind == _WAKE:
            self.wake_at = math.inf
            return now
        self.live -= 1
        if kind == _STEP:
            if ver == self.step_ver[i]:
                self._end_step(i, now)
        else:  # _TIMER: a KV pull or adapter load may let the pod schedule again
            self.timer_at[i] = math.nan
            self._mark(i)
        return now

    def _scrape(self, i: int, now: float) -> None:
        eng = self.engines[i]
        if eng.version != self.scraped_ver[i]:
            self.scraped_ver[i] = eng.version
            self.views[i].metrics = eng.snapshot()
        self.views[i].scraped_at = now
        self._push(now + self.interval, _SCRAPE, i)

    def _kv_events(self, eng: Engine, now: float) -> None:
        events = eng.take_kv_events()  # taken even with no listener (pods with kv_events set), so none pile up
        on_kv = self.sim.on_kv_events
        if events and on_kv is not None:
            on_kv(eng.name, KVEventBatch(ts=now, events=events))

    def _end_step(self, i: int, now: float) -> None:
        eng = self.engines[i]
        done = eng.finish_step()
        self._kv_events(eng, now)
        first_token = self.sim.on_first_token
        if first_token is not None:
            for er in eng.first_tokens:
                fl = er.sink
                if fl.prefill < 0 or fl.prefill_er is not None:  # not a P/D pair's prefill half
                    first_token(fl.req, eng.name, now)
        for er in done:
            self._finish(er.sink, er, now)
        self._mark(i)

    def _start_steps(self, now: float) -> None:
        """Start a step on every changed pod that is idle, or set a timer for when it can."""
        for i in self.dirty:
            self.is_dirty[i] = False
            eng = self.engines[i]
            if eng.in_flight:
                continue
            end = eng.begin_step(now, self.sim.max_steps)
            self._kv_events(eng, now)
            if end is not None:
                self.step_ver[i] += 1
                self._push(end, _STEP, i, self.step_ver[i])
            else:
                t = eng.next_timer()
                if t is not None and t != self.timer_at[i]:
                    self.timer_at[i] = t
                    self._push(max(t, now), _TIMER, i)
        self.dirty.clear()

    def _check_stalled(self) -> None:
        if self.live == 0 and self.next_arrival == len(self.arrivals) and self.outstanding > 0 and not self.held:
            raise RuntimeError(f"simulation stalled: {self.outstanding} requests can never be scheduled")

    # -- requests

    def _arrive(self, req: SimRequest, now: float) -> None:
        if self.interval <= 0:  # no scraper: the router sees the pods as they are
            for eng, view in zip(self.engines, self.views, strict=True):
                view.metrics, view.scraped_at = eng.snapshot(), now
        decision = self.sim.route(req, self.views, now)
        if decision is HOLD:
            if self.sim.poll is None:
                raise TypeError("the router answered HOLD but has no poll()")
            self.held += 1
            return
        self._admit(req, decision, now)

    def _poll(self, now: float) -> None:
        """Take back what a queueing router releases now, and wake at its next deadline."""
        for req, decision in self.sim.poll(self.views, now):  # type: ignore[misc]
            self.held -= 1
            self._admit(req, decision, now)
        wake = self.sim.next_poll() if self.held and self.sim.next_poll is not None else math.inf
        if wake < self.wake_at:
            self.wake_at = wake
            heapq.heappush(self.heap, (max(wake, now), next(self.seq), _WAKE, -1, 0))

    def _admit(self, req: SimRequest, decision: RouteDecision, now: float) -> None:
        if decision is None:
            self._record(RequestResult(req.request_id, req.model, DROPPED, req.arrival_time), req, counted=False)
            return
        p_name, d_name = decision if isinstance(decision, tuple) else (None, decision)
        d = self.sim.pod_index(d_name)
        p = self.sim.pod_index(p_name) if p_name is not None and p_name != d_name else -1
        first = p if p >= 0 else d
        eng = self.engines[first]
        try:
            prompt = eng.engine_prompt(req.prompt, req.body.get("messages"))
        except ValueError as e:  # a pod with a tokenizer but no chat template: vLLM's 400
            prompt, problem = [], str(e)
        else:
            problem = _refusal(eng, req, prompt) or (_refusal(self.engines[d], req, prompt) if p >= 0 else None)
        if problem is not None:
            res = RequestResult(req.request_id, req.model, REJECTED, req.arrival_time, pod=eng.name, error=problem)
            self._record(res, req, counted=False)
            return
        er = eng.new_request(
            req.request_id, prompt, req.max_tokens, now, lora=_lora(eng, req.model),
            ignore_eos=req.ignore_eos, output_len=req.output_tokens, remote_decode=p >= 0,
        )  # fmt: skip
        er.sink = _Flight(req, d, p)
        self.outstanding += 1
        self._submit(first, er, now)

    def _submit(self, i: int, er: EngineRequest, now: float) -> None:
        """Add a request to pod i; a step in flight is cut short so the request joins the next one."""
        eng = self.engines[i]
        eng.add(er)
        self.requests_per_pod[i] += 1
        if eng.in_flight:
            old = eng.step_end
            if eng.truncate(now) != old:
                self.step_ver[i] += 1
                self._push(eng.step_end, _STEP, i, self.step_ver[i])
        self._mark(i)

    def _finish(self, fl: _Flight, er: EngineRequest, now: float) -> None:
        req = fl.req
        if fl.prefill_er is None and fl.prefill >= 0:  # prefill half done: hand the KV to the decoder
            dec = self.engines[fl.decode]
            prompt = dec.engine_prompt(req.prompt, req.body.get("messages"))
            d_er = dec.new_request(
                req.request_id, prompt, req.max_tokens, now, lora=_lora(dec, req.model),
                ignore_eos=req.ignore_eos, output_len=req.output_tokens, remote_prefill=True,
            )  # fmt: skip
            d_er.sink = _Flight(req, fl.decode, fl.prefill, er)
            self._submit(fl.decode, d_er, now)
            return
        first = fl.prefill_er if fl.prefill_er is not None else er
        res = RequestResult(
            request_id=req.request_id, model=req.model, status=OK, arrival=req.arrival_time,
            pod=self.engines[fl.decode].name,
            prefill_pod=self.engines[fl.prefill].name if fl.prefill >= 0 else None,
            ttft=er.first_token_time - req.arrival_time, e2e=er.finish_time - req.arrival_time,
            itl=(er.finish_time - er.first_token_time) / (er.num_output - 1) if er.num_output > 1 else math.nan,
            queue_wait=first.first_scheduled - req.arrival_time, prompt_tokens=er.prompt_tokens,
            cached_tokens=max(0, first.num_cached_tokens), output_tokens=er.num_output,
            preemptions=er.preemptions + (first.preemptions if first is not er else 0),
            lora_loaded=er.lora_loaded or first.lora_loaded,
        )  # fmt: skip
        self._record(res, req)

    def _record(self, res: RequestResult, req: SimRequest, counted: bool = True) -> None:
        """Keep a request's outcome; `counted` when it was admitted (and so was outstanding)."""
        if counted:
            self.outstanding -= 1
        if self.sim.on_complete is not None:
            self.sim.on_complete(req, res.pod, res)
        self.results.append(res)

    def report(self, wall_s: float) -> SimReport:
        ok_times = [r.arrival + r.e2e for r in self.results if r.status == OK]
        start = self.arrivals[0].arrival_time if self.arrivals else 0.0
        duration = (max(ok_times) - start) if ok_times else 0.0
        pods = [
            PodStats(e.name, self.requests_per_pod[i], e.prefix_queries, e.prefix_hits, e.lora.loads, e.preemptions,
                     e.kv.evictions, e.steps, e.busy_time)
            for i, e in enumerate(self.engines)
        ]  # fmt: skip
        return SimReport(self.results, pods, duration, wall_s)


def _refusal(engine: Engine, req: SimRequest, prompt: Prompt) -> str | None:
    """Why a pod would answer 400/404 to this request (`prompt` as the pod sees it), or None."""
    try:
        engine.resolve_model(req.model)
    except KeyError:
        return f"The model `{req.model}` does not exist."
    problem = engine.check(count_tokens(prompt), req.max_tokens)
    return problem[0] if problem else None


def _lora(engine: Engine, model: str) -> str | None:
    try:
        return engine.resolve_model(model)
    except KeyError:
        return None


def run_cluster_sim(
    pods: Sequence[PodConfig] | int,
    workload: Iterable[SimRequest],
    router: Router | RouteFn,
    *,
    scrape_interval: float = 0.05,
    seed: int = 0,
    on_complete: CompleteFn | None = None,
    on_first_token: FirstTokenFn | None = None,
) -> SimReport:
    """One-call form of ClusterSim(...).run(workload)."""
    sim = ClusterSim(
        pods, router, scrape_interval=scrape_interval, seed=seed, on_complete=on_complete, on_first_token=on_first_token
    )
    return sim.run(workload)
