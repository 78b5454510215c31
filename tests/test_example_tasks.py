"""The example task set (examples/tasks): every task loads, its verifier can fail, and its reference solution passes.

No sandbox: each test copies the task's environment/workspace into a temporary folder, points the OPENFORGE_* path
variables at the task's folders (the tasks use them with the sandbox paths as defaults), starts the task's services
on a free loopback port passed as OPENFORGE_SERVICE_PORT (so xdist workers never collide), and runs
tests/test.sh (and solution/solve.sh) with bash. Services are killed on every path.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from rollout._task import Task, load_task, load_tasks

TASKS_DIR = Path(__file__).resolve().parents[1] / "examples" / "tasks"
TASK_DIRS = sorted(p for p in TASKS_DIR.iterdir() if (p / "task.toml").is_file()) if TASKS_DIR.is_dir() else []
SCRIPT_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _folder_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(f"{p.relative_to(root)}\0{p.stat().st_mode & 0o777}\0".encode() + p.read_bytes() + b"\0")
    return h.hexdigest()


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = log.read_text(errors="replace")
            raise AssertionError(f"service exited with {proc.returncode} before listening on {port}:\n{out}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise AssertionError(f"service did not listen on 127.0.0.1:{port} within {timeout_s}s")


class Rollout:
    """One task's workspace, reward folder and running services, outside any sandbox."""

    def __init__(self, task: Task, root: Path):
        self.task = task
        self.root = root
        self.workspace = root / "workspace"
        self.reward_dir = root / "logs" / "verifier"
        if task.workspace_seed:
            shutil.copytree(task.workspace_seed, self.workspace, symlinks=True)
        else:
            self.workspace.mkdir(parents=True)
        self.reward_dir.mkdir(parents=True)
        self.port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENFORGE_")}
        env.update({
            "HOME": str(root / "home"),
            "TMPDIR": str(root / "tmp"),
            "OPENFORGE_WORKSPACE": str(self.workspace),
            "OPENFORGE_TESTS": str(task.tests_dir),
            "OPENFORGE_SOLUTION": str(task.path / "solution"),
            "OPENFORGE_ENVIRONMENT": str(task.path / "environment"),
            "OPENFORGE_REWARD_DIR": str(self.reward_dir),
            "OPENFORGE_SERVICE_PORT": str(self.port),
        })
        (root / "home").mkdir()
        (root / "tmp").mkdir()
        # `python3` as the sandbox has it: the base interpreter (not this venv, not a slow pyenv shim), and -S so
        # no site-packages are importable, like the sandbox's stdlib-only Debian python
        base = Path(sys.base_prefix) / "bin" / "python3"
        bin_dir = root / "bin"
        bin_dir.mkdir()
        interpreter = base if base.is_file() else shutil.which("python3")
        (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{interpreter}" -S "$@"\n')
        (bin_dir / "python3").chmod(0o755)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        self.env = env
        self.services: list[subprocess.Popen] = []

    def start_services(self) -> None:
        assert len(self.task.config.environment.services) <= 1, \
            "one service per task: OPENFORGE_SERVICE_PORT names one port"
        for svc in self.task.config.environment.services:
            log = self.root / f"service-{svc.name}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(svc.command, cwd=self.workspace, env=self.env, stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            self.services.append(proc)
            if svc.port is not None:
                _wait_port(self.port, proc, log, svc.ready_timeout_sec)

    def stop_services(self) -> None:
        for proc in self.services:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(timeout=10)
        self.services.clear()

    def run(self, script: Path) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(script)], cwd=self.workspace, env=self.env, stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=SCRIPT_TIMEOUT_S)

    def solve(self) -> None:
        p = self.run(self.task.path / "solution" / "solve.sh")
        assert p.returncode == 0, f"solve.sh exited {p.returncode}:\n{p.stdout.decode()}\n{p.stderr.decode()}"

    def verify(self) -> dict:
        for f in self.reward_dir.iterdir():
            f.unlink()
        p = self.run(self.task.tests_dir / "test.sh")
        detail = f"\n--- stdout\n{p.stdout.decode()}\n--- stderr\n{p.stderr.decode()}"
        assert p.returncode == 0, f"the verifier crashed (exit {p.returncode}): an infra error, not a score{detail}"
        rj, rt = self.reward_dir / "reward.json", self.reward_dir / "reward.txt"
        assert rj.is_file() or rt.is_file(), f"the verifier wrote no reward{detail}"
        result = json.loads(rj.read_text()) if rj.is_file() else {"reward": float(rt.read_text().strip())}
        assert 0.0 <= float(result["reward"]) <= 1.0, result
        if rj.is_file():
            assert isinstance(result.get("checks"), dict) and result["checks"], result
            assert all(isinstance(v, bool) for v in result["checks"].values()), result
        if rj.is_file() and rt.is_file():
            assert float(rt.read_text().strip()) == pytest.approx(float(result["reward"]))
        return result


@pytest.fixture(params=TASK_DIRS, ids=[p.name for p in TASK_DIRS])
def rollout(request, tmp_path):
    task = load_task(request.param)
    before = _folder_digest(task.path)
    r = Rollout(task, tmp_path)
    try:
        r.start_services()
        yield r
    finally:
        r.stop_services()
    assert _folder_digest(task.path) == before, "running the task changed files in the task folder"


def test_untouched_workspace_fails(rollout):
    result = rollout.verify()
    assert float(result["reward"]) < rollout.task.config.task.pass_threshold, result


def test_reference_solution_passes(rollout):
    assert rollout.task.solution_dir is not None, "every example task ships solution/solve.sh"
    rollout.solve()
    first = rollout.verify()
    assert float(first["reward"]) == 1.0, json.dumps(first, indent=1)
    assert all(first["checks"].values()), first
    assert rollout.verify() == first, "the verifier is not deterministic"
    rollout.solve()   # solutions are idempotent: a second run leaves a passing state passing
    assert float(rollout.verify()["reward"]) == 1.0


# A plausible mistake per task, applied after the reference solution: the verifier must not give it a pass.
_API = ("python3 - <<'X'\nimport json, os, urllib.request\n"
        "def call(m, p, b=None):\n"
        "    r = urllib.request.Request(f\"http://127.0.0.1:{os.environ['OPENFORGE_SERVICE_PORT']}{p}\", method=m,\n"
        "        data=None if b is None else json.dumps(b).encode(), headers={'Content-Type': 'application/json'})\n"
        "    return json.loads(urllib.request.urlopen(r, timeout=10).read())\n")
NEAR_MISSES = {
    "files-organise-by-date": "mkdir -p archive/2023/02 && mv archive/undated/invoice_2023-02-29.pdf archive/2023/02/",
    "files-config-to-json": "sed -i 's/\"debug\": false/\"debug\": \"false\"/' config.json",
    "files-fix-inventory-script":   # hard-codes today's output instead of fixing the logic
        "python3 inventory.py inventory.csv > out.txt\n"
        "echo \"print(open('$PWD/out.txt').read(), end='')\" > inventory.py",
    "files-dedupe-mailing-list": "echo TOM.R@example.com >> subscribers_clean.txt",
    "files-largest-log-errors": "sed -i 's/app-2024-05-02.log/app-2024-05-03.log/' error_summary.json",
    "finance-category-totals": "sed -i '2d' category_totals.csv",
    "finance-reconcile-ledgers": "echo 'PAY-24100,1.00,1.00,amount_mismatch' >> reconciliation.csv",
    "finance-currency-conversion": "sed -i '2s/,.*/,1.00/' expenses_eur.csv",
    "finance-duplicate-invoices": "sed -i '$d' duplicates.csv",
    "finance-monthly-balance": "sed -i '/2024-03/d' monthly_balance.csv",
    "helpdesk-close-stale-pending": _API + "call('PATCH', '/tickets/9', {'status': 'closed'})\nX",   # the vip ticket
    "helpdesk-assign-by-load": _API + "call('PATCH', '/tickets/3', {'assignee': 'jules'})\nX",
    "helpdesk-reply-order-status":   # answers a message that is not an order inquiry
        _API + "call('POST', '/mailbox/messages', {'to': 'ali.m@example.org', 'subject': 'Re: Invoice for May', "
               "'body': 'Sure.', 'in_reply_to': 'm006'})\nX",
    "helpdesk-escalate-sla-breaches": _API + "call('PATCH', '/tickets/4', {'tags': ['sla-breach']})\nX",
    "helpdesk-open-ticket-report": _API + "call('POST', '/tickets/1/comments', {'body': 'Looked at it.'})\nX",
}


def test_near_miss_does_not_pass(rollout):
    mistake = NEAR_MISSES.get(rollout.task.id)
    if mistake is None:
        pytest.skip("no near miss written for this task yet")
    rollout.solve()
    p = subprocess.run(["bash", "-c", "set -e\n" + mistake], cwd=rollout.workspace, env=rollout.env,
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=SCRIPT_TIMEOUT_S)
    assert p.returncode == 0, p.stderr.decode()
    result = rollout.verify()
    assert float(result["reward"]) < rollout.task.config.task.pass_threshold, result
    assert not all(result["checks"].values()), result


def test_task_set_loads():
    tasks = load_tasks(TASKS_DIR)
    assert len(tasks) >= 12
    domains = Counter(t.domain for t in tasks)
    assert len(domains) >= 3, domains
    for t in tasks:
        c = t.config
        assert t.id == t.path.name
        assert c.task.domain, f"{t.id}: set [task] domain"
        assert c.task.reference_steps and c.task.required_tools, f"{t.id}: set reference_steps and required_tools"
        known_tools = {"bash", "read_file", "write_file"} | {s.name for s in c.environment.services}
        assert set(c.task.required_tools) <= known_tools, f"{t.id}: unknown tools in required_tools"
        assert t.workspace_seed is not None and t.solution_dir is not None
        assert (t.tests_dir / "test.sh").stat().st_mode & 0o111, f"{t.id}: tests/test.sh is not executable"
        assert (t.path / "solution" / "solve.sh").stat().st_mode & 0o111, f"{t.id}: solve.sh is not executable"
        assert c.environment.docker_image, f"{t.id}: name a docker_image"
        for svc in c.environment.services:
            assert svc.port, f"{t.id}: service {svc.name} needs a port so the sandbox waits for it"
            assert svc.name in c.task.required_tools
            assert "OPENFORGE_SERVICE_PORT" in " ".join(svc.command), f"{t.id}: honour OPENFORGE_SERVICE_PORT"
    readme = (TASKS_DIR / "README.md").read_text()
    for t in tasks:
        assert f"`{t.id}`" in readme, f"examples/tasks/README.md does not list {t.id}"
