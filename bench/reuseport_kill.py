"""What the kernel does with a SO_REUSEPORT listener's connections when its process is SIGKILLed:
the gateway's replicas share one port this way (serve_app/gateway/ingress.py), and a replica killed under
load takes with it the connections it had accepted and those still queued on its socket. Linux
(>= 5.14) hands the queued ones to a surviving listener when `net.ipv4.tcp_migrate_req` is 1.

Two processes listen on one port with a deliberately slow accept loop (so the backlog holds
connections); 16 client threads connect, send, read; one listener is SIGKILLed after 1 s. Counted:
answered, reset, refused. Plain sockets, no Ray: it isolates the kernel's part.

The sysctl is per network namespace, so the script runs itself in a fresh one (`unshare -n`, needs
root) per setting and leaves the host's untouched:

    sudo .venv/bin/python -m bench.reuseport_kill [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

PORT = 18555
CLIENTS = 16


def _listen_forever() -> None:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", PORT))
    s.listen(128)
    while True:
        conn, _ = s.accept()
        threading.Thread(target=_answer, args=(conn,), daemon=True).start()
        time.sleep(0.002)  # slow accepts: connections wait in this socket's queue


def _answer(conn: socket.socket) -> None:
    try:
        conn.recv(100)
        time.sleep(0.005)
        conn.sendall(b"ok")
        conn.close()
    except OSError:
        pass


def one_run() -> dict[str, int]:
    """Inside the namespace: two listeners, the clients, one SIGKILL."""
    pids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            _listen_forever()
            os._exit(0)
        pids.append(pid)
    time.sleep(0.5)
    counts = {"answered": 0, "reset": 0, "refused": 0, "other": 0}
    lock = threading.Lock()
    stop = time.monotonic() + 3.0

    def client() -> None:
        while time.monotonic() < stop:
            try:
                with socket.create_connection(("127.0.0.1", PORT), timeout=5) as c:
                    c.sendall(b"hi")
                    kind = "answered" if c.recv(10) == b"ok" else "reset"
            except ConnectionResetError:
                kind = "reset"
            except ConnectionRefusedError:
                kind = "refused"
            except OSError:
                kind = "other"
            with lock:
                counts[kind] += 1

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    os.kill(pids[0], signal.SIGKILL)
    for t in threads:
        t.join()
    os.kill(pids[1], signal.SIGKILL)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inside:
        with open("/proc/sys/net/ipv4/tcp_migrate_req") as f:
            print(f"tcp_migrate_req={f.read().strip()} {one_run()}", flush=True)
        return
    for _ in range(args.runs):
        for migrate in (0, 1):
            script = (
                f"ip link set lo up && echo {migrate} > /proc/sys/net/ipv4/tcp_migrate_req && "
                f"exec {sys.executable} -m bench.reuseport_kill --inside"
            )
            subprocess.run(["unshare", "-n", "sh", "-c", script], check=True)


if __name__ == "__main__":
    main()
