"""`epp pods list|add|remove`: change a running gateway's pods through its admin route.

The token comes from `--token-file` or the EPP_ADMIN_TOKEN environment variable (never a plain
flag: the command line of a process is visible to every user of the machine); the gateway's
settings must set the same `admin_token` (serve_app/admin/api.py). Exit 0 on success, 1 when the
gateway refused (its message is printed), 2 when it can not be reached or the arguments are wrong."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

TOKEN_ENV = "EPP_ADMIN_TOKEN"
URL_ENV = "EPP_URL"


class AdminError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def add_admin_options(p: argparse.ArgumentParser) -> None:
    """The options of a command that calls the admin route: the gateway's URL, the token's file."""
    default_url = os.environ.get(URL_ENV, "http://127.0.0.1:8000")
    p.add_argument("--url", default=default_url, help="the gateway (default %(default)s, or $EPP_URL)")
    p.add_argument("--token-file", help=f"file holding the admin token (default: ${TOKEN_ENV})")


def add_pods_arguments(p: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    add_admin_options(common)
    sub = p.add_subparsers(dest="pods_command", required=True)
    ls = sub.add_parser("list", parents=[common], help="every pod: state, source, draining; the pod sources' status")
    ls.add_argument("--json", action="store_true", help="print the admin route's JSON")
    add = sub.add_parser("add", parents=[common], help="add a pod (or replace the pod of that name)")
    add.add_argument("name")
    add.add_argument("address", help="HOST:PORT of the model server")
    add.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="a label (repeatable)")
    rm = sub.add_parser(
        "remove", parents=[common], help="drain a pod (no new requests, in-flight ones finish), then remove it"
    )
    rm.add_argument("name")
    rm.add_argument("--now", action="store_true", help="remove it at once instead of draining")
    rm.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds until it has left")


def run_pods(args: argparse.Namespace) -> int:
    try:
        token = read_admin_token(args.token_file)
        client = AdminClient(args.url, token)
        if args.pods_command == "list":
            return _list(client, args.json)
        if args.pods_command == "add":
            return _add(client, args.name, args.address, args.label)
        return _remove(client, args.name, args.now, args.wait)
    except AdminError as err:
        print(f"epp pods: {err}", file=sys.stderr)
        return 1 if err.status else 2
    except ValueError as err:
        print(f"epp pods: {err}", file=sys.stderr)
        return 2


def read_admin_token(path: str | None) -> str:
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as err:
            raise ValueError(f"can not read the token file {path!r}: {err.strerror}") from None
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise ValueError(f"no admin token: set ${TOKEN_ENV} or pass --token-file")
    return token


class AdminClient:
    def __init__(self, url: str, token: str, timeout_s: float = 35.0) -> None:
        self.url = url.rstrip("/")
        self._token = token
        self._timeout_s = timeout_s

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        req.add_header("Authorization", f"Bearer {self._token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self._timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            raise AdminError(err.code, f"{err.code}: {_message(err.read())}") from None
        except (OSError, ValueError) as err:
            raise AdminError(0, f"can not reach the gateway at {self.url}: {err}") from None


def _message(raw: bytes) -> str:
    try:
        return json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return raw.decode(errors="replace")[:300]


def _list(client: AdminClient, as_json: bool) -> int:
    data = client.call("GET", "/admin/pods")
    if as_json:
        print(json.dumps(data, indent=2))
        return 0
    rows = [("NAME", "ADDRESS", "STATE", "SOURCE", "LABELS")]
    for pod in sorted(data["pods"], key=lambda p: p["name"]):
        state = pod["state"] + (f" {pod['draining_s']:.0f}s" if pod.get("draining_s") is not None else "")
        labels = ",".join(f"{k}={v}" for k, v in sorted(pod["labels"].items()))
        rows.append((pod["name"], f"{pod['address']}:{pod['port']}", state, pod["source"], labels or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4])
    for source in data["sources"]:
        if source["last_error"]:
            print(f"pod source {source['id']}: ERROR, keeping the last good set: {source['last_error']}")
        else:
            print(f"pod source {source['id']}: ok, {source['pods']} pods, {source['reloads']} loads")
    return 0


def _add(client: AdminClient, name: str, address: str, labels: list[str]) -> int:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"address must be HOST:PORT, got {address!r}")
    parsed: dict[str, str] = {}
    for label in labels:
        key, eq, value = label.partition("=")
        if not eq or not key:
            raise ValueError(f"a label is KEY=VALUE, got {label!r}")
        parsed[key] = value
    pod = {"name": name, "address": host.strip("[]"), "port": int(port), "labels": parsed}
    change = client.call("POST", "/admin/pods", pod)
    what = "replaced" if change["replaced"] else "added" if change["added"] else "unchanged"
    print(f"pod {name} {what}")
    return 0


def _remove(client: AdminClient, name: str, now: bool, wait_s: float) -> int:
    client.call("DELETE", f"/admin/pods/{urllib.request.quote(name, safe='')}?drain={'false' if now else 'true'}")
    if now:
        print(f"pod {name} removed")
        return 0
    print(f"pod {name} draining: no new requests; it leaves when its requests are done")
    deadline = time.monotonic() + wait_s
    while wait_s > 0:
        if name not in {p["name"] for p in client.call("GET", "/admin/pods")["pods"]}:
            print(f"pod {name} has left")
            return 0
        if time.monotonic() > deadline:
            print(f"epp pods: {name} still draining after {wait_s:.0f} s", file=sys.stderr)
            return 1
        time.sleep(0.2)
    return 0
