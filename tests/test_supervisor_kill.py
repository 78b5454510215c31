"""Failures nobody can dodge: a harness cannot kill, stop or inspect ``sandbox_init`` (the sandbox's pid 1), so
``kill -9 -1`` and friends end as a graded rollout (reward 0, recorded, never an infra error or an exclusion), with or
without task services; processes it leaves, however many and however they hop pids, are all gone before the
verifier starts."""

from __future__ import annotations

import pytest

from rollout._backends.base import Phase, SandboxSpec
from rollout._task import load_task
from tests.rollout_fixtures import ANSWER_TEST, CommandHarness, write_task

VERIFIER = ANSWER_TEST.replace("#!/bin/bash\n", '#!/bin/bash\ncd "$OPENFORGE_WORKSPACE"\n', 1)
SERVICE = ("[[environment.services]]\nname = 'api'\nport = 8931\n"
           "command = ['python3', '-m', 'http.server', '8931', '--bind', '127.0.0.1']\n")


def _task(root, name, toml=""):
    return load_task(write_task(root, name, test_sh=VERIFIER, toml=toml, instruction="Write 42 into answer.txt."))


def _graded(forge, res):
    (reward,) = forge.store.rewards(res.rollout_id)
    assert forge.store.lineage("exclusions") == [] and reward.value == res.reward
    return res.outcome, res.reward


@pytest.mark.parametrize("services", [False, True], ids=["no-service", "service"])
def test_kill_minus_one_is_a_graded_harness_error(forge, shared_tmp, services):
    """``kill -9 -1`` from a child takes the harness down with everything else it may signal, but not pid 1."""
    task = _task(shared_tmp / "tasks", "killall", SERVICE if services else "")
    harness = CommandHarness("bash", "-c", "echo 42 > answer.txt; bash -c 'kill -9 -1'; echo survived")
    summary = forge.run([task], harness, max_infra_retries=2)
    (res,) = summary.results
    assert _graded(forge, res) == ("harness_error", 0.0), res.detail


def test_signals_to_pid_1_change_nothing(forge, shared_tmp):
    """Every signal to pid 1 from inside is dropped (it has no handler); the harness then does the task."""
    sigs = "KILL STOP TERM INT HUP QUIT USR1 USR2 SEGV ABRT ALRM"
    harness = CommandHarness("bash", "-c", f"for s in {sigs}; do kill -$s 1; /bin/kill -s $s 1; done; "
                             "kill -9 -1; echo 42 > answer.txt")
    summary = forge.run([_task(shared_tmp / "tasks", "pid1", SERVICE)], harness, max_infra_retries=0)
    (res,) = summary.results
    # bash's own `kill -9 -1` spares bash itself; the service died with the rest, so the rollout is graded 0
    assert _graded(forge, res) == ("harness_error", 0.0) and "api" in res.detail, res.detail
    summary = forge.run([_task(shared_tmp / "tasks", "pid1-alone")], harness, max_infra_retries=0)
    (res,) = summary.results
    assert _graded(forge, res) == ("success", 1.0), res.detail


def test_init_is_pid_1_and_closed_to_the_harness(forge):
    backend = forge.backend
    probe = ("import os, ctypes; out = {'cmdline': open('/proc/1/cmdline', 'rb').read().split(b'\\0')[3].decode()}\n"
             "for p in ('/proc/1/environ', '/proc/1/mem', '/proc/1/fd'):\n"
             "    try:\n        os.listdir(p) if p.endswith('fd') else open(p, 'rb').read(1); out[p] = 'open'\n"
             "    except OSError as e:\n        out[p] = type(e).__name__\n"
             "libc = ctypes.CDLL(None, use_errno=True)\n"
             "out['ptrace'] = libc.ptrace(16, 1, 0, 0) == 0\n"          # PTRACE_ATTACH
             "print(out)")
    sb = backend.create(SandboxSpec(rollout_id="pid1", run_id="r", group_id="g", task_id="t", workspace_seed=None,
                                    environment_dir=None, phases=()))
    try:
        r = backend.exec(sb, ["python3", "-c", probe])
        touch = backend.exec(sb, ["bash", "-c", "touch /etc/ld.so.preload /evil"])
    finally:
        backend.destroy(sb)
    out = eval(r.stdout)   # noqa: S307 - our own probe's repr
    assert out["cmdline"] == "/opt/openforge/init.py", out
    assert all(out[p] == "PermissionError" for p in ("/proc/1/environ", "/proc/1/mem", "/proc/1/fd")), out
    assert out["ptrace"] is False, out
    assert touch.exit_code != 0 and b"Read-only file system" in touch.stderr, touch


def test_a_swarm_of_pid_hoppers_is_killed_before_the_next_phase(forge):
    """Detached processes that keep forking a successor and exiting (a new pid each time) and a forking crowd:
    one pass over /proc misses some; stop-then-kill until none is left does not."""
    backend = forge.backend
    swarm = ("for i in $(seq 20); do setsid bash -c 'h() { ( sleep 0.005; h ) & }; h' >/dev/null 2>&1 & done; "
             "for i in $(seq 20); do setsid bash -c 'while :; do sleep 0.01 & wait; done' >/dev/null 2>&1 & done; "
             "sleep 0.5")
    count = ("import os; print(sum(1 for p in os.listdir('/proc') if p.isdigit()))")
    sb = backend.create(SandboxSpec(rollout_id="swarm", run_id="r", group_id="g", task_id="t", workspace_seed=None,
                                    environment_dir=None, phases=()))
    try:
        h = backend.run_phase(sb, Phase("harness", ("bash", "-c", swarm), timeout_s=20))
        after = backend.exec(sb, ["python3", "-c", count])
    finally:
        backend.destroy(sb)
    assert h.exit_code == 0 and h.strays_left == [], h
    assert after.stdout.strip() == b"2", after      # init and the counting python3
