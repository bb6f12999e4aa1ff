"""Smoke test of EPPRequestRouter inside Ray Serve LLM, for a GPU machine (under 5 minutes with the
default 0.5B model): start the OpenAI app of ray_epp.examples.serve_llm, send 20 chat requests (four
long shared system prompts, and a LoRA adapter if `--lora-path` is given), print where each went,
the destination spread and the router's counters.

    python -m bench.serve_llm_smoke                          # needs a GPU and ray[llm]
    python -m bench.serve_llm_smoke --lora-path s3://bucket/loras --lora-id qwen-0.5b:my-adapter
    python -m bench.serve_llm_smoke --fake                   # CPU: FakeLLMServer replicas (simulator)

The requests go through a handle to the LLM deployment from this process, so the router making
the decisions is this process's (its `recent_decisions()` and `router_stats()` are printed), plus
one request through the app's HTTP route `/v1/chat/completions` to show the OpenAI surface serves.
Exit status 1 when a request failed, none was scheduled by EPP, or a shared prefix did not stick.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
APP = "llm_app"
GROUPS = 4
REQUESTS = 20


@dataclass(slots=True)
class Sent:
    index: int
    group: int
    lora: str
    replica: str = ""
    how: str = ""
    latency_s: float = 0.0
    error: str = ""


def smoke_requests(model: str, lora_id: str | None, n: int = REQUESTS) -> list[tuple[int, str, dict[str, Any]]]:
    """(group, lora id or "", chat body): GROUPS long system prompts in turn; every fifth request for
    the adapter when there is one."""
    systems = [f"You are assistant {g}. " + " ".join(f"rule-{g}-{i}: answer briefly." for i in range(120))
               for g in range(GROUPS)]  # fmt: skip
    out = []
    for i in range(n):
        group, lora = i % GROUPS, (lora_id if lora_id and i % 5 == 4 else "")
        body = {
            "model": lora or model,
            "messages": [{"role": "system", "content": systems[group]}, {"role": "user", "content": f"Q{i}: hi"}],
            "max_tokens": 8,
        }
        out.append((group, lora, body))
    return out


def find_llm_deployment(app: str) -> str:
    """The LLM server deployment of a Ray Serve LLM app (not its OpenAI ingress)."""
    from ray import serve

    names = list(serve.status().applications[app].deployments)
    servers = [n for n in names if "Ingress" not in n and "Router" not in n]
    if len(servers) != 1:
        raise RuntimeError(f"expected one LLM deployment in {app!r}, found {names}")
    return servers[0]


async def send_all(handle: Any, requests: list[tuple[int, str, dict[str, Any]]], fake: bool) -> list[Sent]:
    """One at a time, so the router's i-th decision is the i-th request's."""
    if fake:
        from bench.serve_llm_replica import request_model as make
    else:
        from ray.serve.llm.openai_api_models import ChatCompletionRequest

        make = ChatCompletionRequest.model_validate
    out = []
    for i, (group, lora, body) in enumerate(requests):
        sent = Sent(i, group, lora)
        h = handle.options(multiplexed_model_id=lora) if lora else handle
        if not fake:
            h = h.options(stream=True)  # LLMServer.chat is a generator
        started = time.monotonic()
        try:
            if fake:
                answer = await h.chat.remote(make(body))
                sent.replica = answer["replica"]
            else:
                async for _ in h.chat.remote(make(body)):
                    pass
        except Exception as err:  # shown, and the exit status says so
            sent.error = f"{type(err).__name__}: {err}"
        sent.latency_s = time.monotonic() - started
        out.append(sent)
    return out


def attach_decisions(sent: list[Sent], decisions: list[Any]) -> None:
    """Match the router's decisions to the requests, in order (requests were sent one at a time)."""
    ok = [s for s in sent if not s.error]
    for s, d in zip(ok, decisions[-len(ok) :] if ok else [], strict=False):
        if s.replica and s.replica != d.replica:
            s.how = f"{d.how} (router says {d.replica}!)"
        else:
            s.replica, s.how = d.replica, d.how


def http_check(port: int, model: str) -> str:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body.encode(),
                                 {"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=120) as resp:
        answer = json.loads(resp.read())
    return str(answer["choices"][0]["message"]["content"])[:60]


def report(sent: list[Sent], stats: dict[str, Any]) -> int:
    for s in sent:
        lora = f" lora={s.lora}" if s.lora else ""
        status = s.error or f"-> {s.replica} ({s.how}) {1e3 * s.latency_s:.0f} ms"
        print(f"request {s.index:2d} prefix-group {s.group}{lora}: {status}")
    spread = Counter(s.replica for s in sent if not s.error)
    print("destination spread:", dict(spread))
    by_group: dict[int, Counter] = {}
    for s in sent:
        if not s.error and not s.lora:
            by_group.setdefault(s.group, Counter())[s.replica] += 1
    for group, where in sorted(by_group.items()):
        print(f"prefix group {group}: {dict(where)}")
    print("router_stats:", json.dumps(stats, default=str))
    failed = [s for s in sent if s.error]
    # A group's first request may land anywhere; the later ones should follow it (4 of 5 at least).
    stuck = all(where.most_common(1)[0][1] >= max(1, sum(where.values()) - 1) for where in by_group.values())
    problems = []
    if failed:
        problems.append(f"{len(failed)} requests failed")
    if not stats.get("scheduled"):
        problems.append("no request was scheduled by EPP (all fell back)")
    if not stuck:
        problems.append("a shared prefix did not stick to one replica")
    print("OK" if not problems else "PROBLEMS: " + "; ".join(problems))
    return 1 if problems else 0


def start_fake(replicas: int, config: str) -> tuple[Any, str]:
    from ray import serve

    from bench.serve_llm_replica import FakeLLMServer
    from ray_epp.examples.serve_llm import router_config

    app = serve.deployment(
        FakeLLMServer, name="FakeLLM", num_replicas=replicas, max_ongoing_requests=1000,
        ray_actor_options={"num_cpus": 0}, request_router_config=router_config(config, stats_period_s=0.2),
    ).bind(pod={"max_loras": 4, "lora_adapters": ["smoke-lora"]})  # fmt: skip
    serve.run(app, name=APP, route_prefix="/smoke")
    return serve.get_deployment_handle("FakeLLM", app_name=APP), "smoke-lora"


def start_real(args: argparse.Namespace) -> tuple[Any, str | None]:
    from ray import serve

    from ray_epp.examples.serve_llm import build_app

    app = build_app(model_id=args.model_id, model_source=args.model_source, replicas=args.replicas,
                    config=args.config, lora_path=args.lora_path)  # fmt: skip
    serve.run(app, name=APP, route_prefix="/")
    return serve.get_deployment_handle(find_llm_deployment(APP), app_name=APP), args.lora_id


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fake", action="store_true", help="CPU only: simulated replicas instead of vLLM")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--config", default="ray_epp/configs/default.yaml")
    ap.add_argument("--model-id", default="qwen-0.5b")
    ap.add_argument("--model-source", default="Qwen/Qwen2.5-0.5B-Instruct")
    ap.add_argument("--lora-path", help="LoRA adapters' cloud path (GPU run)")
    ap.add_argument("--lora-id", help="a LoRA model id to send every fifth request to, e.g. qwen-0.5b:adapter")
    ap.add_argument("--port", type=int, default=int(os.environ.get("EPP_TEST_PORT", "8000")))
    ap.add_argument("--address", help="an existing Ray cluster (default: start one here)")
    args = ap.parse_args(argv)
    from serve_app.cli.launch import serve_fast_path_env

    if args.fake:
        serve_fast_path_env()
    import ray
    from ray import serve

    from serve_app.llm_router.router import recent_decisions, router_stats

    started = time.monotonic()
    owns_ray = not ray.is_initialized()
    if not owns_ray:
        pass  # a caller's Ray (tests): leave it running
    elif args.address:
        ray.init(address=args.address, log_to_driver=False)
    elif args.fake:
        from bench.local_ray import start_local_ray

        start_local_ray()
    else:
        ray.init(include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    try:
        handle, lora = start_fake(args.replicas, args.config) if args.fake else start_real(args)
        print(f"app up in {time.monotonic() - started:.0f} s", flush=True)
        requests = smoke_requests("base" if args.fake else args.model_id, lora)
        sent = asyncio.run(send_all(handle, requests, args.fake))
        time.sleep(0.5)  # the routers' hooks run on their loop
        attach_decisions(sent, recent_decisions(len(requests)))
        if not args.fake:
            print("HTTP /v1/chat/completions:", http_check(args.port, args.model_id))
        code = report(sent, router_stats())
    finally:
        serve.delete(APP)
        from actors.launcher import stop_router_profile_actors
        from serve_app.llm_router.router import ROUTER_NAMESPACE, read_config

        stop_router_profile_actors(read_config(args.config), namespace=ROUTER_NAMESPACE)
        if owns_ray and not args.address:
            serve.shutdown()
            ray.shutdown()
    print(f"done in {time.monotonic() - started:.0f} s")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
