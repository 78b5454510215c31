"""``openforge proxy --workers N``: N proxy processes behind one address, supervised.

The supervisor binds the listening socket once and hands it to N worker processes (``WORKER``: ``openforge
proxy`` with ``--listen-fd`` and ``--replica-id``): they accept from the one queue (the kernel
gives each connection to one of them), so a worker that dies leaves the connections still queued to the others.
Each worker is a replica (``proxy._build``): its own journal and rollout ledger, named by its replica id, the
store, token secret and admin token shared (made here, before any worker starts, so that no two make different
ones). A worker that dies is restarted under the same id, and the new one drains what the dead one journaled
(opening a journal replays it); journals of replica ids this run does not use (a previous run with more workers)
are drained into the store at start, as ``openforge store drain`` would. SIGTERM / SIGINT stop the workers
(each drains its journal into the store) and then the supervisor.

The run folder (``--run-dir``, made fresh here, owner-only, removed at the end) holds each worker's private admin
socket and the proxy-wide state: a worker that receives a pause, an activation or an upstream change applies it to
every sibling before it answers, and a restarted worker starts in that state (``proxy._siblings``, ``proxy._fleet``).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from forge_store import Settings, open_store

from ._settings import ProxySettings

log = logging.getLogger("proxy")

# A worker: ``openforge proxy`` on the supervisor's socket (the command itself, without the roof's loading).
WORKER = "import typer; from proxy._cli import proxy_command; typer.run(proxy_command)"
FAST_EXIT_S = 5.0  # a worker that exits this soon after starting, non-zero, twice in a row: a start-up error


@dataclass
class Worker:
    replica_id: str
    proc: subprocess.Popen
    started: float = field(default_factory=time.monotonic)
    fast_exits: int = 0


def replica_ids(workers: int, prefix: str | None) -> list[str]:
    """``0``..``N-1``, or ``<prefix>-0``.. when the replica id of this supervisor is given."""
    return [f"{prefix}-{i}" if prefix else str(i) for i in range(workers)]


def ensure_schema(store_url: str | None, settings: Settings, say) -> None:
    """Create the schema in an empty database once, here: workers starting together on an empty database would
    each try, and all but one fail. A database that cannot be reached now is left to the workers (they start
    offline and their drains create it when it answers); another revision than this code's is an error (raised)."""
    from forge_store import StoreUnavailable

    try:
        open_store(store_url, settings=settings).close()
    except StoreUnavailable as exc:
        say(f"the store cannot be reached now ({exc}); the workers start without it and journal")


def drain_orphans(store_url: str | None, settings: Settings, journal: str, keep: list[str], say) -> None:
    """Drain the journals of ``<journal>-*`` replicas not in ``keep`` (left by a run with more workers, or killed)
    into the store; one its writer still holds is left to it."""
    from forge_store import JournalLocked, StoreError

    root = settings.journal_dir or settings.home / "journal"
    if not root.is_dir():
        return
    wanted = {f"{journal}-{r}" for r in keep}
    for folder in sorted(root.iterdir()):
        name = folder.name
        if not folder.is_dir() or not name.startswith(journal + "-") or name in wanted:
            continue
        jsettings = settings.model_copy(update={"journal_dir": folder}) if settings.journal_dir else settings
        try:
            store = open_store(store_url, journal=True, name=name, settings=jsettings)
        except JournalLocked:
            say(f"journal {name}: held by a running writer, which drains it itself")
            continue
        except StoreError as exc:  # the database is away: the journal keeps it for a later start or store drain
            say(f"journal {name}: not drained now ({exc}); `openforge store drain` or the next start drains it")
            continue
        pending = store.writer_status().get("pending_ops", 0)
        store.close(timeout=60)
        say(f"journal {name}: drained {pending:,} operations left by a replica this run does not start")


class Supervisor:
    """Start, watch and restart the workers; stop them on SIGTERM / SIGINT."""

    def __init__(self, listener: socket.socket, args: list[str], ids: list[str], say, run_dir: Path):
        self.listener, self.args, self.ids, self.say, self.run_dir = listener, args, ids, say, run_dir
        self.workers: dict[str, Worker] = {}
        self.stopping = False

    def _spawn(self, replica_id: str) -> subprocess.Popen:
        fd = self.listener.fileno()
        cmd = [sys.executable, "-c", WORKER, *self.args, "--replica-id", replica_id, "--listen-fd", str(fd),
               "--run-dir", str(self.run_dir)]
        return subprocess.Popen(cmd, pass_fds=(fd,))

    def run(self) -> int:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        for rid in self.ids:
            self.workers[rid] = Worker(rid, self._spawn(rid))
        self.say(f"{len(self.ids)} workers (replicas {', '.join(self.ids)}), pids "
                 + ", ".join(str(w.proc.pid) for w in self.workers.values()))
        while not self.stopping:
            code = self._watch()
            if code is not None:
                self._stop_all()
                return code
            time.sleep(0.2)
        return self._stop_all()

    def _watch(self) -> int | None:
        """Restart workers that died; an exit code when the supervisor should give up."""
        for rid, w in self.workers.items():
            rc = w.proc.poll()
            if rc is None or self.stopping:
                continue
            quick = rc != 0 and time.monotonic() - w.started < FAST_EXIT_S
            w.fast_exits = w.fast_exits + 1 if quick else 0
            if w.fast_exits >= 2:
                self.say(f"worker {rid} exited {rc} twice within {FAST_EXIT_S:.0f}s of starting: giving up (its "
                         "error is above)")
                return rc if rc > 0 else 1
            self.say(f"worker {rid} (pid {w.proc.pid}) exited {_how(rc)}; restarting it under the same replica id "
                     "(it drains the journal the old one left)")
            fast = w.fast_exits
            self.workers[rid] = Worker(rid, self._spawn(rid), fast_exits=fast)
        return None

    def _on_signal(self, signum, frame) -> None:
        self.stopping = True

    def _stop_all(self, grace_s: float = 60.0) -> int:
        for w in self.workers.values():
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for w in self.workers.values():
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"worker {w.replica_id} did not stop in {grace_s:.0f}s: killed (its journal is drained by "
                         "the next start)")
                w.proc.kill()
                w.proc.wait()
        return 0


def supervise(listener: socket.socket, workers: int, args: list[str], *, store_url: str | None, settings: Settings,
              proxy_settings: ProxySettings, journal: str, replica_prefix: str | None, say) -> int:
    """Run ``workers`` workers on ``listener`` until SIGTERM / SIGINT; the exit code."""
    from ._auth import load_or_create_secret

    if not proxy_settings.token_secret:  # one secret and one admin token for all, before any worker could make its own
        load_or_create_secret(settings.home / "proxy-secret")
    if not proxy_settings.admin_token:
        load_or_create_secret(settings.home / "proxy-admin-token")
    ids = replica_ids(workers, replica_prefix)
    ensure_schema(store_url, settings, say)
    drain_orphans(store_url, settings, journal, ids, say)
    listener.listen(2048)  # connections queue while a worker starts or restarts
    # short (a Unix socket's path has ~100 bytes), owner-only, this run's: the workers' sockets and shared state
    run_dir = Path(tempfile.mkdtemp(prefix="openforge-proxy-"))
    try:
        return Supervisor(listener, args, ids, say, run_dir).run()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _how(rc: int) -> str:
    return f"on signal {signal.Signals(-rc).name}" if rc < 0 else f"with code {rc}"


def worker_args(*, upstream: str | list[str], store: str | None, dialect: str, journal: str, policy_version: str | None,
                upstream_api_key_file: Path | None, log_level: str, host: str, port: int) -> list[str]:
    """The ``openforge proxy`` options a worker runs with (its replica id and socket are added per worker)."""
    args = [a for u in ([upstream] if isinstance(upstream, str) else upstream) for a in ("--upstream", u)]
    args += ["--dialect", dialect, "--journal", journal, "--log-level", log_level,
            "--host", host, "--port", str(port)]
    if store is not None:
        args += ["--store", store]
    if policy_version is not None:
        args += ["--policy-version", policy_version]
    if upstream_api_key_file is not None:
        args += ["--upstream-api-key-file", str(upstream_api_key_file)]
    return args
