"""`EngineReplicas`: N scripted engines (`ScriptedUpstream`), each in its own process, for a proxy that routes over
replicas: what a deployment of N engine servers looks like.

Each runs in its own process so that one can be killed (`kill`: SIGKILL, its connections reset mid-answer, as when
an engine crashes or its node goes) and so that the doubles do not share the test's interpreter. One process
(`python -m tests.doubles.engine_replicas`) imports and loads the tokenizer once, then forks one child per replica: a
process per double paid its ~7 s of imports each on a loaded 2-core machine. Each simulates an engine's cost with
`slow` (seconds a request spends in the engine) and `capacity` (requests it handles at once, the others queue):
see `ScriptedUpstream.set_capacity`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

__all__ = ["EngineReplicas"]

_ROOT = Path(__file__).resolve().parents[2]   # `python -m tests.doubles.engine_replicas` runs from the checkout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EngineReplicas:
    """``with EngineReplicas(4, slow=0.05, capacity=4) as engines: engines.urls``; ``kill(i)``, ``requests(i)``."""

    def __init__(self, n: int, *, slow: float = 0.0, capacity: int | None = None, owned_by: str | list[str] = "vllm",
                 chunk_tokens: int = 1, model: str | None = None, start_timeout_s: float = 120.0):
        if n < 1:
            raise ValueError(f"{n} replicas: start at least 1")
        owners = [owned_by] * n if isinstance(owned_by, str) else list(owned_by)
        if len(owners) != n:
            raise ValueError(f"owned_by names {len(owners)} engines for {n} replicas; give one per replica or one")
        self.n, self.slow, self.capacity, self.owners = n, slow, capacity, owners
        self.chunk_tokens, self.model, self.start_timeout_s = chunk_tokens, model, start_timeout_s
        self.ports: list[int] = []
        self.pids: list[int] = []
        self.killed: set[int] = set()
        self._parent: subprocess.Popen | None = None
        self._log = None  # the replicas' stderr (a file: a pipe nobody reads would fill and block them)

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def start(self) -> list[str]:
        self.ports = [_free_port() for _ in range(self.n)]
        cmd = [sys.executable, "-m", "tests.doubles.engine_replicas", "--ports", ",".join(map(str, self.ports)),
               "--owned-by", ",".join(self.owners), "--slow", str(self.slow), "--chunk-tokens", str(self.chunk_tokens)]
        if self.capacity:
            cmd += ["--capacity", str(self.capacity)]
        if self.model:
            cmd += ["--model", self.model]
        self._log = tempfile.TemporaryFile()
        self._parent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=_ROOT)
        line = self._parent.stdout.readline()  # the children's pids, once forked
        if not line:
            self._parent.wait(10)
            raise RuntimeError(f"the engine replicas did not start ({self._parent.returncode}): {self.log()[-2000:]}")
        self.pids = json.loads(line)["pids"]
        deadline = time.monotonic() + self.start_timeout_s
        for i in range(self.n):
            while not self._answers(i):
                if time.monotonic() > deadline or self._parent.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"engine replica {i} did not serve on {self.urls[i]} within "
                                       f"{self.start_timeout_s:g}s: {self.log()[-2000:]}")
                time.sleep(0.05)
        return self.urls

    def log(self) -> str:
        """What the replicas wrote to stderr so far."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def _answers(self, i: int) -> bool:
        try:
            with urllib.request.urlopen(self.urls[i] + "/health", timeout=1) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _get(self, i: int, path: str):
        with urllib.request.urlopen(self.urls[i] + path, timeout=30) as r:
            return json.loads(r.read())

    def _post(self, i: int, path: str, body: dict):
        req = urllib.request.Request(self.urls[i] + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def requests(self, i: int) -> list[dict]:
        """The requests replica ``i`` received (method, path, headers, json, received_at)."""
        return self._get(i, "/_scripted/requests")

    def calls(self) -> Counter:
        """Model calls (POST /v1/chat/completions or /v1/completions) each live replica received: index -> count."""
        return Counter({i: sum(1 for r in self.requests(i) if r["method"] == "POST" and r["path"].startswith("/v1/"))
                        for i in range(self.n) if self.alive(i)})

    def script(self, i: int, steps: list[dict], replace: bool = True) -> None:
        self._post(i, "/_scripted/script", {"steps": steps, "replace": replace})

    def state(self, i: int, **state) -> dict:
        """``slow``, ``down``, ``capacity`` of replica ``i`` (``ScriptedUpstream``'s control route)."""
        return self._post(i, "/_scripted/state", state)

    def alive(self, i: int) -> bool:
        return i not in self.killed

    def kill(self, i: int) -> None:
        """SIGKILL replica ``i``: its connections reset, answers in flight break off."""
        os.kill(self.pids[i], signal.SIGKILL)
        self.killed.add(i)

    def stop(self) -> None:
        if self._parent is None:
            return
        if self._parent.poll() is None:
            self._parent.terminate()  # it stops its children
            try:
                self._parent.wait(15)
            except subprocess.TimeoutExpired:
                self._parent.kill()
                self._parent.wait(10)
        for pid in self.pids:  # whatever its supervisor left
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._parent.stdout.close()
        self._log.close()
        self._parent = None

    def __enter__(self) -> EngineReplicas:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent (the supervisor) dies; elsewhere nothing."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> None:
    """Load once, fork one double per port, print their pids as one JSON line, reap them; SIGTERM stops them all."""
    import argparse
    import gc

    import uvicorn

    from proxy.engines.scripted.tokenizer import load_smollm2_tokenizer
    from proxy.engines.scripted.upstream import DEFAULT_MODEL, ScriptedUpstream

    ap = argparse.ArgumentParser(prog="python -m tests.doubles.engine_replicas", description=main.__doc__)
    ap.add_argument("--ports", required=True, help="comma-separated: one replica per port")
    ap.add_argument("--owned-by", default="vllm", help="comma-separated, one per port, or one for all")
    ap.add_argument("--slow", type=float, default=0.0)
    ap.add_argument("--capacity", type=int, default=None)
    ap.add_argument("--chunk-tokens", type=int, default=1)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    args = ap.parse_args(argv)
    ports = [int(p) for p in args.ports.split(",")]
    owners = args.owned_by.split(",")
    owners = owners * len(ports) if len(owners) == 1 else owners
    tokenizer = load_smollm2_tokenizer()
    gc.collect()
    gc.freeze()  # as the double's own main: the tokenizer stays out of full collections (and shared after fork)
    pids = []
    for port, owner in zip(ports, owners):
        pid = os.fork()
        if pid == 0:
            try:
                _die_with_parent()
                up = ScriptedUpstream(tokenizer=tokenizer, model=args.model, chunk_tokens=args.chunk_tokens,
                                      owned_by=owner, capacity=args.capacity)
                up.set_slow(args.slow)
                uvicorn.run(up.app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
            finally:
                os._exit(0)
        pids.append(pid)

    def stop(*_):
        for child in pids:
            try:
                os.kill(child, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, stop)
    parent = os.getppid()

    def orphaned() -> None:  # whoever started us is gone (a test killed): the replicas go too
        while os.getppid() == parent:
            time.sleep(1.0)
        stop()

    threading.Thread(target=orphaned, daemon=True).start()
    print(json.dumps({"pids": pids}), flush=True)
    for _ in pids:
        try:
            os.wait()
        except ChildProcessError:
            break


if __name__ == "__main__":
    main()
