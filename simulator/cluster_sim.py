"""Driver 2: N pods of the same engine model in virtual time, routed by any callable.

A discrete-event loop (a heap of step ends, KV-pull timers and scrapes; arrivals merged from the
sorted workload) — no asyncio, no sleeping. Each arrival is handed to the router together with the
pods' metrics as a scraper polling every `scrape_interval` seconds last saw them (each pod scraped
at its own seeded phase), so routing on stale metrics has its real consequences. A router may
answer a pod name, None (shed the request), or a (prefill_pod, decode_pod) pair: the prefill pod
runs the prompt, the decode pod pulls the KV (paying the transfer time) and generates.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from simulator.config import ROLE_LABEL, PodConfig
from simulator.engine import Engine, EngineRequest
from simulator.report import DROPPED, OK, REJECTED, PodStats, RequestResult, SimReport
from simulator.tokens import Prompt, count_tokens, flatten_messages

RouteDecision = str | tuple[str | None, str] | None


@dataclass(slots=True, eq=False)
class SimRequest:
    """One workload request. `body` is the OpenAI body; `prompt` its flattened text (or token ids)."""

    request_id: str
    arrival_time: float
    model: str
    body: dict[str, Any]
    prompt: Prompt
    prompt_tokens: int
    max_tokens: int
    priority: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    ignore_eos: bool = False
    output_tokens: int | None = None  # exact output length (e.g. replayed traces); else the pod decides

    @classmethod
    def from_body(
        cls,
        request_id: str,
        arrival_time: float,
        body: dict[str, Any],
        *,
        priority: int = 0,
        headers: dict[str, str] | None = None,
        output_tokens: int | None = None,
        default_max_tokens: int = 16,
    ) -> SimRequest:
        """Build from an OpenAI completions (`prompt`) or chat (`messages`) body."""
        prompt: Prompt
        if "messages" in body:
            prompt = flatten_messages(body["messages"])
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max_tokens
        else:
            raw = body["prompt"]
            prompt = raw[0] if isinstance(raw, list) and raw and isinstance(raw[0], str) else raw
            max_tokens = body.get("max_tokens") or default_max_tokens
        return cls(
            request_id=request_id,
            arrival_time=arrival_time,
            model=body["model"],
            body=body,
            prompt=prompt,
            prompt_tokens=count_tokens(prompt),
            max_tokens=int(max_tokens),
            priority=priority,
            headers=dict(headers or {}),
            ignore_eos=bool(body.get("ignore_eos", False)),
            output_tokens=output_tokens,
        )


@dataclass(slots=True)
class PodView:
    """What a router sees of a pod: identity and its last scraped metrics (DESIGN.md JSON form)."""

    name: str
    labels: dict[str, str]
    metrics: dict[str, Any]
    scraped_at: float = 0.0

    @property
    def role(self) -> str:
        return self.labels.get(ROLE_LABEL, "both")


@runtime_checkable
class Router(Protocol):
    """A routing policy; `on_complete(request, pod, result)` and `on_first_token(request, pod, now)`
    are optional extra methods."""

    def route(self, request: SimRequest, pods: list[PodView], now: float) -> RouteDecision: ...


RouteFn = Callable[[SimRequest, list[PodView], float], RouteDecision]
CompleteFn = Callable[[SimRequest, str | None, RequestResult], None]
FirstTokenFn = Callable[[SimRequest, str, float], None]


@dataclass(slots=True)
class _Flight:
    """The simulation's per-request state, attached to engine requests as their sink."""

    req: SimRequest
    decode: int
    prefill: int = -1  # pod index of the prefill half, -1 when not split
    prefill_er: EngineRequest | None = None


_STEP, _TIMER, _SCRAPE = 0, 1, 2


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
    ) -> None:
        configs = [PodConfig(name=f"sim-{i}") for i in range(pods)] if isinstance(pods, int) else list(pods)
        if not configs:
            raise ValueError("at least one pod is needed")
        self.configs = configs
        self.route: RouteFn = router.route if isinstance(router, Router) else router
        self.on_complete = on_complete or getattr(router, "on_complete", None)
        # Called when a request's first token reaches the client (from the decode pod, under P/D).
        self.on_first_token = on_first_token or getattr(router, "on_first_token", None)
        self.scrape_interval = scrape_interval
        self.seed = seed
        self.max_steps = max_steps
        self.engines = [Engine(c, seed) for c in configs]
        self.index = {c.name: i for i, c in enumerate(configs)}
        if len(self.index) != len(configs):
            raise ValueError("pod names must be unique")
        self.views = [PodView(c.name, c.all_labels(), e.snapshot()) for c, e in zip(configs, self.engines, strict=True)]
        self.now = 0.0

    def run(self, workload: Iterable[SimRequest]) -> SimReport:
        wall0 = time.perf_counter()
        arrivals = sorted(workload, key=lambda r: r.arrival_time)
        engines, views, n = self.engines, self.views, len(self.engines)
        heap: list[tuple[float, int, int, int, int]] = []
        seq = itertools.count()
        step_ver = [0] * n
        timer_at = [math.nan] * n
        scraped_ver = [-1] * n
        requests_per_pod = [0] * n
        dirty: list[int] = []
        is_dirty = [False] * n
        results: list[RequestResult] = []
        self._outstanding = 0
        interval = self.scrape_interval
        if interval > 0:
            rng = random.Random(f"scrape:{self.seed}")
            t0 = arrivals[0].arrival_time if arrivals else 0.0
            for i in range(n):
                heapq.heappush(heap, (t0 + rng.random() * interval, next(seq), _SCRAPE, i, 0))
        max_steps = self.max_steps
        first_token = self.on_first_token
        ai, n_arr = 0, len(arrivals)
        live = [0]  # step and timer events in the heap; with none left and requests outstanding we are stuck

        def mark(i: int) -> None:
            if not is_dirty[i]:
                is_dirty[i] = True
                dirty.append(i)

        def submit(i: int, er: EngineRequest, now: float) -> None:
            eng = engines[i]
            eng.add(er)
            requests_per_pod[i] += 1
            if eng.in_flight:
                old = eng.step_end
                if eng.truncate(now) != old:
                    step_ver[i] += 1
                    live[0] += 1
                    heapq.heappush(heap, (eng.step_end, next(seq), _STEP, i, step_ver[i]))
            mark(i)

        def finish(fl: _Flight, er: EngineRequest, now: float) -> None:
            req = fl.req
            if fl.prefill_er is None and fl.prefill >= 0:  # prefill half done: hand the KV to the decoder
                dec = engines[fl.decode]
                d_er = dec.new_request(
                    req.request_id, req.prompt, req.max_tokens, now, lora=_lora(dec, req.model),
                    ignore_eos=req.ignore_eos, output_len=req.output_tokens, remote_prefill=True,
                )  # fmt: skip
                d_er.sink = _Flight(req, fl.decode, fl.prefill, er)
                submit(fl.decode, d_er, now)
                return
            first = fl.prefill_er if fl.prefill_er is not None else er
            res = RequestResult(
                request_id=req.request_id, model=req.model, status=OK, arrival=req.arrival_time,
                pod=engines[fl.decode].name, prefill_pod=engines[fl.prefill].name if fl.prefill >= 0 else None,
                ttft=er.first_token_time - req.arrival_time, e2e=er.finish_time - req.arrival_time,
                itl=(er.finish_time - er.first_token_time) / (er.num_output - 1) if er.num_output > 1 else math.nan,
                queue_wait=first.first_scheduled - req.arrival_time, prompt_tokens=er.prompt_tokens,
                cached_tokens=max(0, first.num_cached_tokens), output_tokens=er.num_output,
                preemptions=er.preemptions + (first.preemptions if first is not er else 0),
                lora_loaded=er.lora_loaded or first.lora_loaded,
            )  # fmt: skip
            self._done(res, req)
            results.append(res)

        def arrive(req: SimRequest, now: float) -> None:
            if interval <= 0:
                for i, v in enumerate(views):
                    v.metrics, v.scraped_at = engines[i].snapshot(), now
            decision = self.route(req, views, now)
            if decision is None:
                res = RequestResult(req.request_id, req.model, DROPPED, req.arrival_time)
                self._done(res, req, counted=False)
                results.append(res)
                return
            p_name, d_name = decision if isinstance(decision, tuple) else (None, decision)
            d = self._pod_index(d_name)
            p = self._pod_index(p_name) if p_name is not None and p_name != d_name else -1
            first = p if p >= 0 else d
            eng = engines[first]
            problem = _refusal(eng, req) or (_refusal(engines[d], req) if p >= 0 else None)
            if problem is not None:
                res = RequestResult(req.request_id, req.model, REJECTED, req.arrival_time, pod=eng.name, error=problem)
                self._done(res, req, counted=False)
                results.append(res)
                return
            er = eng.new_request(
                req.request_id, req.prompt, req.max_tokens, now, lora=_lora(eng, req.model),
                ignore_eos=req.ignore_eos, output_len=req.output_tokens, remote_decode=p >= 0,
            )  # fmt: skip
            er.sink = _Flight(req, d, p)
            self._outstanding += 1
            submit(first, er, now)

        while ai < n_arr or self._outstanding > 0:
            t_arr = arrivals[ai].arrival_time if ai < n_arr else math.inf
            t_ev = heap[0][0] if heap else math.inf
            if t_arr == math.inf and t_ev == math.inf:
                break
            if t_ev <= t_arr:
                now, _, kind, i, ver = heapq.heappop(heap)
                self.now = now
                if kind != _SCRAPE:
                    live[0] -= 1
                if kind == _STEP:
                    if ver == step_ver[i]:
                        done = engines[i].finish_step()
                        if first_token is not None:
                            for er in engines[i].first_tokens:
                                fl = er.sink
                                if fl.prefill < 0 or fl.prefill_er is not None:  # not a P/D pair's prefill half
                                    first_token(fl.req, engines[i].name, now)
                        for er in done:
                            finish(er.sink, er, now)
                        mark(i)
                elif kind == _TIMER:
                    timer_at[i] = math.nan
                    mark(i)
                else:
                    eng = engines[i]
                    if eng.version != scraped_ver[i]:
                        scraped_ver[i] = eng.version
                        views[i].metrics = eng.snapshot()
                    views[i].scraped_at = now
                    heapq.heappush(heap, (now + interval, next(seq), _SCRAPE, i, 0))
            else:
                now = t_arr
                self.now = now
                arrive(arrivals[ai], now)
                ai += 1
            if dirty:
                t_next = min(heap[0][0] if heap else math.inf, arrivals[ai].arrival_time if ai < n_arr else math.inf)
                if t_next > now:  # every event at `now` is in: start the steps
                    for i in dirty:
                        is_dirty[i] = False
                        eng = engines[i]
                        if eng.in_flight:
                            continue
                        end = eng.begin_step(now, max_steps)
                        if end is not None:
                            step_ver[i] += 1
                            live[0] += 1
                            heapq.heappush(heap, (end, next(seq), _STEP, i, step_ver[i]))
                        else:
                            t = eng.next_timer()
                            if t is not None and t != timer_at[i]:
                                timer_at[i] = t
                                live[0] += 1
                                heapq.heappush(heap, (max(t, now), next(seq), _TIMER, i, 0))
                    dirty.clear()
                    if live[0] == 0 and ai == n_arr and self._outstanding > 0:
                        raise RuntimeError(f"simulation stalled: {self._outstanding} requests can never be scheduled")
        ok_times = [r.arrival + r.e2e for r in results if r.status == OK]
        start = arrivals[0].arrival_time if arrivals else 0.0
        duration = (max(ok_times) - start) if ok_times else 0.0
        pods = [
            PodStats(e.name, requests_per_pod[i], e.prefix_queries, e.prefix_hits, e.lora.loads, e.preemptions,
                     e.kv.evictions, e.steps, e.busy_time)
            for i, e in enumerate(engines)
        ]
        return SimReport(results, pods, duration, time.perf_counter() - wall0)

    def _pod_index(self, name: str) -> int:
        try:
            return self.index[name]
        except KeyError:
            raise ValueError(f"router returned unknown pod {name!r}") from None

    def _done(self, res: RequestResult, req: SimRequest, counted: bool = True) -> None:
        if counted:
            self._outstanding -= 1
        if self.on_complete is not None:
            self.on_complete(req, res.pod, res)


def _refusal(engine: Engine, req: SimRequest) -> str | None:
    """Why a pod would answer 400/404 to this request, or None."""
    try:
        engine.resolve_model(req.model)
    except KeyError:
        return f"The model `{req.model}` does not exist."
    problem = engine.check(req.prompt_tokens, req.max_tokens)
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
