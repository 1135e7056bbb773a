"""What the scripts that drive an HTTP server (bench_warm.py, soak_serve.py, bench_serve.py) share:
a free port, a GET, waiting for a spawned server to be ready, stopping it, and the prompt words."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import time

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, path: str, timeout: float = 30) -> dict:
    """{"status", "body"} of GET path on 127.0.0.1:port, or {"error"} when it could not be asked."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        c.close()
        try:
            body = json.loads(body) if body else None
        except ValueError:
            body = body[:200]
        return {"status": r.status, "body": body}
    except OSError as e:
        return {"error": str(e)}


def wait_ready(proc: subprocess.Popen, port: int, path: str = "/healthz", timeout: float = 300, name: str = "server",
               fatal: tuple[int, ...] = ()) -> None:
    """Until GET path answers 200; SystemExit when the process exits, a status in `fatal` comes
    back (reflex serve's 503: the model failed to load) or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with {proc.returncode} during start-up")
        h = get(port, path, timeout=2)
        if h.get("status") == 200:
            return
        if h.get("status") in fatal:
            raise SystemExit(f"{name}: {path} answered {h['status']}: {h.get('body')}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{name} was not ready after {timeout:g} s")
        time.sleep(0.05)


def stop(proc: subprocess.Popen, grace: float = 10) -> None:
    """Terminate, then kill after `grace` seconds: no server is left behind."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
