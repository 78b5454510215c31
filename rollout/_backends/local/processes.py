"""The bubblewrap process of each sandbox: started in its own process group, killed as a group, and found again
through ``meta.json`` by a later orchestrator when the one that started it died (``reap``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

from .bwrap import BASE_PATH


def spawn(argv: list[str], keep_fd: int, log: Path, run_as: int | None) -> subprocess.Popen:
    """Start ``argv`` in a new session (its own process group), passing ``keep_fd``, output to ``log``, as
    ``run_as`` when set."""
    creds = {} if run_as is None else {"user": run_as, "group": run_as, "extra_groups": []}
    with open(log, "wb") as out:
        return subprocess.Popen(argv, pass_fds=(keep_fd,), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, env={"PATH": BASE_PATH, "LANG": "C.UTF-8"}, **creds)


def write_meta(d: Path, *, rollout_id: str, run_id: str, pid: int, created_at: float) -> None:
    """What ``reap`` needs to find this sandbox's process and whether its orchestrator (this process) still lives."""
    (d / "meta.json").write_text(json.dumps({"rollout_id": rollout_id, "run_id": run_id, "pid": pid,
                                             "owner_pid": os.getpid(), "created_at": created_at}))


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def reap(root: Path, *, run_id: str | None) -> list[str]:
    """Remove the sandbox folders under ``root`` whose orchestrator is gone (or all of ``run_id``'s), killing the
    bubblewrap process group that still runs; returns their names."""
    removed = []
    for d in sorted(root.iterdir()) if root.exists() else []:
        meta = _read_meta(d)
        if meta is None:
            continue
        mine = run_id is not None and meta.get("run_id") == run_id
        orphan = not _alive(meta.get("owner_pid"))
        if not (mine or orphan):
            continue
        pid = meta.get("pid")
        if pid and _is_bwrap(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d.name)
    return removed


def _read_meta(d: Path) -> dict | None:
    try:
        return json.loads((d / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def _alive(pid) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _is_bwrap(pid: int) -> bool:
    """The pid still names a bubblewrap process (not a later process that reused the number)."""
    try:
        return b"bwrap" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
