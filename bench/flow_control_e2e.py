"""Flow control against shed-only admission end to end: the same two-tenant workload as
bench/flow_control.py, sent over HTTP through a real gateway (`epp up`: Ray, Serve, the profile
actors) to simulated vLLM pods in their own process (bench/e2e.py's driver), and measured with the
same steady-state figures (`bench.flow_control.steady_state`).

The pods are slowed `--time-scale` times so one 2-core machine can drive them through the gateway;
every time is reported in the model's time (wall / scale), and the flow-control config's
`defaultRequestTTL` is multiplied by the scale so a request may wait as long, in model time, as in
the cluster simulation. The gateway's own clocks (scrape interval, dispatch tick) are not scaled:
they are finer, in model time, than in a real deployment, for both configs alike. So is the
client's cut-off (`--cutoff`, model seconds after the last arrival); each request that is not ok
is recorded with why (`not_ok`: status, the gateway's code and dropped reason, or the client's).

The tenants arrive as the separate clients they are: each (the critical traffic, `flood`,
`steady`) is `--clients-per-tenant` clients, each client its own source address in 127.0.0.0/8
(127.0.<tenant>.<client>) with its own connection pool, taking its tenant's requests in turn. The
gateway's per-client limits key a client by its source address (connections always; requests and
bodies too, with no API keys and an untrusted fairness header, as `epp up` runs), so one pool
from one address measures those limits, not flow control; `--one-client` sends that way, to see
them. Each row records the most requests one client of each tenant had open at once.

    .venv/bin/python -m bench.flow_control_e2e --load 1.5 --duration 10 --time-scale 20
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from bench.e2e import TARGETS, E2EDriver, failure_split
from bench.flow_control import CAPACITY, CRITICAL_SHARE, ROOT, TENANTS, Labelled, steady_state, workload
from bench.metrics import Outcome
from ray_epp.simulator import make_pod_configs
from scheduler.duration import parse_duration

FLOW = ROOT / "bench/configs/flow-control.yaml"
# label -> (config, gateway settings or None). The third: the queue dispatching one request at a time
# until scheduled (`flow_dispatch_window: 1`), the bound used before the profile actors told their
# ledgers each decision at once; the second runs the default window, one per endpoint.
CONFIGS: dict[str, tuple[Path, dict[str, Any] | None]] = {
    "shed-only (ray_epp/configs/priority.yaml)": (ROOT / "ray_epp/configs/priority.yaml", None),
    "flow control, round-robin (bench/configs/flow-control.yaml)": (FLOW, None),
    "flow control, round-robin, dispatch window 1": (FLOW, {"flow_dispatch_window": 1}),
}


def scaled(path: Path, scale: float, tmp: Path) -> Path:
    """The config with its flowControl TTL multiplied by `scale` (the same file when it has none)."""
    data = yaml.safe_load(path.read_text())
    fc = data.get("flowControl")
    if not fc or "defaultRequestTTL" not in fc:
        return path
    fc["defaultRequestTTL"] = f"{parse_duration(str(fc['defaultRequestTTL'])) * scale:g}s"
    out = tmp / f"scaled-{path.name}"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def _target(config: Path, proxy_port: int, settings: Path | None = None):
    def make(workers: list[str], pods_json: Path, port: int) -> tuple[list[str], str, str]:
        cmd = [sys.executable, "-m", "serve_app.cli", "up", "--pods", str(pods_json), "--port", str(port)]
        cmd += ["--proxy-port", str(proxy_port), "--config", str(config)]
        if settings is not None:
            cmd += ["--settings", str(settings)]
        return cmd, f"http://127.0.0.1:{port}/ready", f"http://127.0.0.1:{port}"

    return make


# The client's cut-off, in model time: a request may wait the TTL (2 s) and then stream 256 tokens
# at a full pod's ~28 ms ITL (7.5 model s measured, docs/decisions/0015-flow-control-opt-in.md); the driver's 60 s wall
# was 3 model s at x20 and counted ~380 streams still running as failed.
CUTOFF_S = 30.0


def _kind(o: Any) -> str:
    return "critical" if o.priority > 0 else "sheddable"


KINDS = ("critical", *TENANTS)  # who sends: the critical traffic and the sheddable tenants
CLIENTS_PER_TENANT = 8


def client_addresses(labelled: Labelled, per_tenant: int) -> dict[str, str]:
    """request id -> the source address of the client sending it: `per_tenant` clients for each
    of `KINDS`, 127.0.<kind, from 1>.<client, from 1>, each taking its kind's requests in turn."""
    if not 1 <= per_tenant <= 254:
        raise ValueError(f"clients per tenant must be 1-254, not {per_tenant}")
    sent = dict.fromkeys(KINDS, 0)
    out = {}
    for r in sorted(labelled.requests, key=lambda r: r.arrival_time):
        kind = labelled.kind[r.request_id]
        out[r.request_id] = f"127.0.{KINDS.index(kind) + 1}.{sent[kind] % per_tenant + 1}"
        sent[kind] += 1
    return out


def peak_open(outcomes: list[Outcome], labelled: Labelled, source: dict[str, str] | None) -> dict[str, int]:
    """Per kind, the most requests one of its clients had open at once, from arrival to its end
    (the answer or refusal; one never answered, to the end): at least as many connections."""
    by_client: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_client.setdefault(source[o.request_id] if source else "one", []).append(o)
    peak: dict[str, int] = {}
    for mine in by_client.values():
        ends = [o.arrival + o.e2e if o.e2e == o.e2e else math.inf for o in mine]  # NaN: never answered
        steps = sorted([(o.arrival, 1) for o in mine] + [(end, -1) for end in ends])  # an end first on a tie
        held = most = 0
        for _, step in steps:
            held += step
            most = max(most, held)
        for kind in {labelled.kind[o.request_id] for o in mine}:
            peak[kind] = max(peak.get(kind, 0), most)
    return peak


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load", type=float, default=1.5, help="fraction of the pool's capacity")
    ap.add_argument("--duration", type=float, default=10.0, help="model seconds of arrivals")
    ap.add_argument("--time-scale", type=float, default=20.0, help="how many times slower the pods run")
    ap.add_argument("--critical-share", type=float, default=CRITICAL_SHARE)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=18530, help="the gateway's port")
    ap.add_argument("--proxy-port", type=int, default=18531, help="Ray Serve's proxy port")
    ap.add_argument("--only", default="", help="run only configs whose label contains this")
    ap.add_argument(
        "--cutoff", type=float, default=CUTOFF_S,
        help="model seconds after the last arrival before open requests count as failed (x time-scale in wall)",
    )  # fmt: skip
    ap.add_argument("--clients-per-tenant", type=int, default=CLIENTS_PER_TENANT, help="source addresses per tenant")
    ap.add_argument(
        "--one-client", action="store_true",
        help="send everything from one address (one client: the gateway's per-client limits apply to all of it)",
    )  # fmt: skip
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--outcomes", type=Path, default=None, help="every request's outcome, a JSON line each")
    args = ap.parse_args(argv)
    labelled = workload(args.load * CAPACITY, args.duration, args.seed, args.critical_share)
    source = None if args.one_client else client_addresses(labelled, args.clients_per_tenant)
    clients = "one (127.0.0.1)" if source is None else f"{args.clients_per_tenant} per tenant ({len(KINDS)} kinds)"
    print(f"load average at start: {os.getloadavg()}; {len(labelled.requests)} requests", flush=True)
    print(f"clients: {clients}", flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="epp-fc-e2e-") as td:
        for i, (label, (path, settings)) in enumerate(CONFIGS.items()):
            if args.only and args.only not in label:
                continue
            name = f"fc-e2e:{i}:{path.name}"
            settings_path = None
            if settings is not None:
                settings_path = Path(td) / f"settings-{i}.yaml"
                settings_path.write_text(yaml.safe_dump(settings))
            TARGETS[name] = _target(scaled(path, args.time_scale, Path(td)), args.proxy_port, settings_path)
            driver = E2EDriver()
            driver.time_scale, driver.max_requests, driver.port = args.time_scale, len(labelled.requests), args.port
            driver.timeout_s = args.cutoff * args.time_scale
            driver.source = None if source is None else (lambda r: source[r.request_id])
            result = driver.run(name, make_pod_configs(8), labelled.requests, args.seed)
            statuses: dict[str, int] = {}
            for o in result.outcomes:
                statuses[o.status] = statuses.get(o.status, 0) + 1
            row = {
                "config": label,
                "load": args.load,
                **steady_state(result.outcomes, labelled),
                "statuses": statuses,
                "clients": clients,
                "peak_open_per_client": peak_open(result.outcomes, labelled, source),
                # what the sheds and failures were, critical vs sheddable: a TTL 429, an upstream
                # 5xx, a cut stream and the client's cut-off are different findings
                "not_ok": failure_split(result.outcomes, key=_kind),
                "wall_s": result.metrics.get("wall_s"),
                "errors": result.extra.get("errors"),
                "load_average": os.getloadavg(),
            }
            rows.append(row)
            if args.outcomes is not None:
                with args.outcomes.open("a") as f:
                    for o in result.outcomes:
                        f.write(json.dumps({"config": label, "kind": labelled.kind[o.request_id], **asdict(o)}) + "\n")
            print(json.dumps(row), flush=True)
            for why, entry in row["not_ok"].items():
                print(f"  {entry['n']:5d}  {why}  {entry['by']}  e.g. {entry['example']}", flush=True)
    print(f"load average at end: {os.getloadavg()}")
    if args.json is not None:
        args.json.write_text(json.dumps({"time_scale": args.time_scale, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
