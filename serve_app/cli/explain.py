"""`epp explain [REQUEST_ID]`: why a request went where it went, from a running gateway's decision
record (GET /admin/decisions/<id>; the gateway settings `decision_record_ratio` and `admin_token`).

Per decision (a retried request has one per attempt) and per profile: each filter's survivors and
what it removed, each scorer's weighted score per endpoint (its raw score clamped to [0, 1] times
its weight, as the profile sums them), the totals, the pick and its margin over the runner-up.
Without a request id: the newest decisions, one line each. The gateway and its token are found as
`epp pods` finds them (--url or $EPP_URL, --token-file or $EPP_ADMIN_TOKEN). Exit 0 when shown, 1
when the gateway refused (no such record, record off, bad token), 2 when it can not be reached."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

from serve_app.cli.pods import AdminClient, AdminError, add_admin_options, read_admin_token


def add_explain_arguments(p: argparse.ArgumentParser) -> None:
    add_admin_options(p)
    p.add_argument("request_id", nargs="?", help="the request's id (its x-request-id); none: the newest decisions")
    p.add_argument("--limit", type=int, default=20, help="without a request id: how many (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the admin route's JSON")


def run_explain(args: argparse.Namespace) -> int:
    try:
        client = AdminClient(args.url, read_admin_token(args.token_file))
        if args.request_id is None:
            data = client.call("GET", f"/admin/decisions?limit={args.limit}")
            print(json.dumps(data, indent=2) if args.json else "\n".join(recent_table(data)))
            return 0
        data = client.call("GET", f"/admin/decisions/{urllib.parse.quote(args.request_id, safe='')}")
    except AdminError as err:
        print(f"epp explain: {err}", file=sys.stderr)
        return 1 if err.status else 2
    except ValueError as err:
        print(f"epp explain: {err}", file=sys.stderr)
        return 2
    print(json.dumps(data, indent=2) if args.json else "\n".join(decision_tables(data["decisions"])))
    return 0


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d} UTC"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _margin(margin: dict[str, Any] | None) -> str:
    return "the only candidate" if margin is None else f"by {_num(margin['by'])} over {margin['over']}"


def recent_table(data: dict[str, Any]) -> list[str]:
    rows = [("REQUEST ID", "DECIDED", "MODEL", "OUTCOME", "TARGET", "MARGIN")]
    for d in data["decisions"]:
        outcome = d["outcome"] if d["error"] is None else f"failed: {d['error']}"
        margin = "-" if d["outcome"] != "scheduled" else _margin(d["margin"])
        rows.append((d["request_id"], _when(d["at"]), d["model"], outcome, d["target"] or "-", margin))
    ratio = data["ratio"]
    return [*_columns(rows), f"{data['kept']} of at most {data['capacity']} requests kept; sampling {ratio:g}"]


def decision_tables(decisions: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for n, d in enumerate(decisions, 1):
        if out:
            out.append("")
        where = f"to {d['target']} ({d['address']})" if d["target"] else f"nowhere: {d['error']}"
        attempt = f"decision {n} of {len(decisions)}: " if len(decisions) > 1 else ""
        out.append(f"{attempt}request {d['request_id']}  model {d['model']}  {_when(d['at'])}  by {d['gateway']}")
        out.append(f"  sent {where}" + (f"; excluded {', '.join(d['excluded'])}" if d["excluded"] else ""))
        trace = d["trace"]
        if len(trace.get("rounds", [])) > 1:
            out.append(f"  profile rounds: {' -> '.join('+'.join(r) for r in trace['rounds'])}")
        for key, value in trace.items():
            if key not in ("rounds", "profiles"):
                out.append(f"  {key}: {json.dumps(value, separators=(',', ':'))}")
        for name, profile in d["profiles"].items():
            out.extend(_profile(name, profile, name == d["primary_profile"], name == d["prefill_profile"]))
    return out


def _profile(name: str, p: dict[str, Any], primary: bool, prefill: bool) -> list[str]:
    role = " (primary)" if primary else " (prefill)" if prefill else ""
    if p.get("error"):
        head = f"failed: {p['error']}"
    else:
        head = f"picked {', '.join(p['picked']) or '-'}, {_margin(p['margin'])}"
    out = [f"  profile {name}{role}: {head}"]
    if p["filters"]:
        rows = [("    FILTER", "TYPE", "KEPT", "REMOVED")]
        for f in p["filters"]:
            rows.append((f"    {f['plugin']}", f["type"], ", ".join(f["kept"]) or "-", ", ".join(f["removed"]) or "-"))
        out.extend(_columns(rows))
    if p["totals"]:
        scorers = p["scorers"]
        header = ["    ENDPOINT", *(f"{s['plugin']} x{s['weight']:g}" for s in scorers), "TOTAL", ""]
        rows = [header]
        for ep in p["ranking"]:
            mark = "<- picked" if ep in p["picked"] else ""
            cells = [_num(s["weighted"].get(ep)) for s in scorers]
            rows.append([f"    {ep}", *cells, _num(p["totals"][ep]), mark])
        out.extend(_columns(rows))
    return out
