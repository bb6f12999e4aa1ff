"""HAProxy moving the bytes in front of the fake workers, as a candidate data plane.

Two shapes, one per benchmark target (bench/gateway_overhead.py):

* `--mode rr`: HAProxy alone, round robin over the workers. No decision: the floor of what a
  compiled byte mover costs on this machine.
* `--mode pick`: Ray EPP decides, HAProxy moves the bytes (the shape of Ray Serve 2.60's HAProxy
  mode with an ingress request router, `ray/serve/_private/ingress_request_router.lua.tmpl`). A
  Lua action sends each completion's body to the gateway's `/v1/pick` (a Ray EPP started here
  with `pick_api` on) over a new loopback connection, reads the chosen endpoint from the answer's
  `x-gateway-destination-endpoint`, and `use-server` sends the request there over HAProxy's pooled
  connections. Every other path goes to the gateway itself.

Not a product: the servers are the pods file's, fixed at start, and the gateway counts each
picked request finished at once (its response never passes Python), so in-flight ledgers, first
tokens, usage and flow control see nothing of it. It measures what this split would cost.

    python -m bench.haproxy_front --mode pick --port 8950 --pods pods.json --epp-port 8960
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

PICK_LUA = r"""
local EPP_HOST, EPP_PORT = "127.0.0.1", %(epp_port)d

local function pick_by_httpclient(txn, body)
    local answer = core.httpclient():post{
        url = "http://" .. EPP_HOST .. ":" .. EPP_PORT .. "/v1/pick?path=" .. txn.sf:path(),
        body = body,
        headers = {["content-type"] = {"application/json"}},
    }
    if not answer or answer.status ~= 200 then
        txn:set_var("txn.epp_failed", "no pick")
        return
    end
    local dst = answer.headers["x-gateway-destination-endpoint"]
    if dst then
        txn:set_var("txn.epp_dst", dst[0])
    else
        txn:set_var("txn.epp_failed", "no destination")
    end
end

core.register_action("epp_pick", {"http-req"}, function(txn)
    local body = txn.sf:req_body() or ""
    if %(httpclient)s then
        return pick_by_httpclient(txn, body)
    end
    local sock = core.tcp()
    sock:settimeout(10)
    if not sock:connect(EPP_HOST, EPP_PORT) then
        txn:set_var("txn.epp_failed", "gateway unreachable")
        return
    end
    sock:send("POST /v1/pick?path=" .. txn.sf:path() .. " HTTP/1.0\r\nHost: epp\r\n"
        .. "Content-Type: application/json\r\nContent-Length: " .. #body .. "\r\n\r\n" .. body)
    local answer = sock:receive("*a")
    sock:close()
    if not answer or not answer:match("^HTTP/[%%d%%.]+ 200") then
        txn:set_var("txn.epp_failed", "no pick")
        return
    end
    local dst = answer:match("\r\n[Xx]%%-[Gg]ateway%%-[Dd]estination%%-[Ee]ndpoint: *([^\r\n]+)")
    if dst then
        txn:set_var("txn.epp_dst", dst)
    else
        txn:set_var("txn.epp_failed", "no destination")
    end
end, 0)
"""


def config(mode: str, port: int, pods: list[dict], epp_port: int | None, lua: Path | None) -> str:
    servers = [f"{p['address']}:{p['port']}" for p in pods]
    lines = [
        "global",
        "    nbthread 2",
        "    maxconn 4096",
        "    tune.bufsize 65536",
        *([f"    lua-load-per-thread {lua}"] if lua is not None else []),
        "defaults",
        "    mode http",
        "    option http-no-delay",  # relay each SSE event as it comes, not when buffers fill
        "    timeout connect 5s",
        "    timeout client 65s",
        "    timeout server 600s",
        "    timeout http-keep-alive 65s",
        "frontend gateway",
        f"    bind 127.0.0.1:{port}",
    ]
    if mode == "rr":
        lines += ["    default_backend pods", "backend pods", "    balance roundrobin", "    http-reuse always"]
        lines += [f"    server w{i} {s}" for i, s in enumerate(servers)]
        return "\n".join(lines) + "\n"
    lines += [
        "    option http-buffer-request",
        "    acl completion path /v1/completions /v1/chat/completions",
        "    http-request lua.epp_pick if completion METH_POST",
        "    http-request return status 503 content-type application/json "
        '    string "{\\"error\\":{\\"message\\":\\"no decision\\"}}" if completion { var(txn.epp_failed) -m found }',
        "    use_backend pods if completion",
        "    default_backend epp",
        "backend pods",
        "    http-reuse always",
        *(f"    use-server w{i} if {{ var(txn.epp_dst) -m str {s} }}" for i, s in enumerate(servers)),
        *(f"    server w{i} {s}" for i, s in enumerate(servers)),
        "backend epp",
        f"    server gateway 127.0.0.1:{epp_port}",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("rr", "pick"), required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pods", required=True, help="pods file (JSON list of name/address/port)")
    p.add_argument("--epp-port", type=int, help="the gateway's own port (mode pick)")
    p.add_argument("--httpclient", action="store_true", help="ask with HAProxy's own HTTP client, not a socket")
    a = p.parse_args()
    pods = json.loads(Path(a.pods).read_text())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with tempfile.TemporaryDirectory() as td, contextlib.ExitStack() as stack:
        tmp = Path(td)
        lua = None
        if a.mode == "pick":
            settings = tmp / "settings.yaml"
            settings.write_text("pick_api: true\n")
            up = [sys.executable, "-m", "serve_app.cli", "up", "--pods", a.pods, "--port", str(a.epp_port)]
            epp = subprocess.Popen([*up, "--settings", str(settings)], start_new_session=True)
            stack.callback(_stop, epp)
            from bench.gateway_overhead import _wait_http

            _wait_http(f"http://127.0.0.1:{a.epp_port}/ready")
            lua = tmp / "epp.lua"
            lua.write_text(PICK_LUA % {"epp_port": a.epp_port, "httpclient": str(a.httpclient).lower()})
        cfg = tmp / "haproxy.cfg"
        cfg.write_text(config(a.mode, a.port, pods, a.epp_port, lua))
        proxy = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], start_new_session=True)
        stack.callback(_stop, proxy)
        print("ready", flush=True)
        while not stop.wait(0.5):
            if proxy.poll() is not None:
                raise SystemExit(f"haproxy exited with {proxy.returncode}")


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


if __name__ == "__main__":
    main()
