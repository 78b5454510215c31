"""Example verifiers against a hostile workspace, run directly (no sandbox, as tests/test_example_tasks.py does).

A harness owns its workspace: it can plant ``json.py`` (or any standard-library name) there and replace an answer
file with a symlink to something outside it (a copy of the right answer, /tests, /logs/verifier). Every verifier
runs ``python3 -I`` and reads workspace files only when they resolve inside the workspace, so a planted module is
never imported and a symlinked answer is never accepted (and the evidence says so).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rollout._task import load_task
from tests.test_example_tasks import SCRIPT_TIMEOUT_S, TASK_DIRS, Rollout

# Standard-library modules every example verifier imports (beyond os and sys, which exist before any path search).
PLANTED = ("json", "hashlib", "decimal", "csv")
# files-fix-inventory-script runs the harness's inventory.py, which imports csv from its own folder by design:
# that is harness code importing harness code, not the verifier importing it.
SCRIPT_IMPORTS = {"files-fix-inventory-script": {"csv"}}


# Tasks whose answer is the state of their service, not a workspace file: no answer file to link out.
SERVICE_ANSWERS = {"helpdesk-assign-by-load", "helpdesk-close-stale-pending", "helpdesk-escalate-sla-breaches",
                   "helpdesk-reply-order-status"}
FILE_ANSWER_DIRS = [p for p in TASK_DIRS if p.name not in SERVICE_ANSWERS]


def _started(task_dir: Path, tmp_path: Path):
    r = Rollout(load_task(task_dir), tmp_path)
    try:
        r.start_services()
        yield r
    finally:
        r.stop_services()


@pytest.fixture(params=TASK_DIRS, ids=[p.name for p in TASK_DIRS])
def rollout(request, tmp_path):
    yield from _started(request.param, tmp_path)


@pytest.fixture(params=FILE_ANSWER_DIRS, ids=[p.name for p in FILE_ANSWER_DIRS])
def file_rollout(request, tmp_path):
    yield from _started(request.param, tmp_path)


def _plant(r: Rollout, marker: Path) -> list[str]:
    names = [n for n in PLANTED if n not in SCRIPT_IMPORTS.get(r.task.id, set())]
    for name in names:
        (r.workspace / f"{name}.py").write_text(
            f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\nraise SystemExit('planted {name} imported')\n")
    return names


def test_planted_stdlib_modules_are_never_imported(rollout, tmp_path):
    marker = tmp_path / "imported.txt"
    names = _plant(rollout, marker)
    # not vacuous: a plain python3 started in the workspace does import them
    p = subprocess.run(["python3", "-c", f"import {names[0]}"], cwd=rollout.workspace, env=rollout.env,
                       capture_output=True, timeout=SCRIPT_TIMEOUT_S)
    assert p.returncode != 0 and marker.read_text() == f"{names[0]}\n", p.stderr
    marker.unlink()
    untouched = rollout.verify()                  # rollout.run starts test.sh with cwd = the workspace
    assert not marker.exists(), marker.read_text()
    assert float(untouched["reward"]) < 1.0
    for name in names:                            # solve.sh runs python3 in the workspace too: not under test
        (rollout.workspace / f"{name}.py").unlink()
    rollout.solve()
    _plant(rollout, marker)
    solved = rollout.verify()
    assert not marker.exists(), marker.read_text()
    assert float(solved["reward"]) == 1.0, json.dumps(solved, indent=1)


def _answer_files(r: Rollout) -> list[Path]:
    """Workspace files the reference solution created or changed (the answers a verifier reads)."""
    before = {p.relative_to(r.workspace): p.read_bytes() for p in r.workspace.rglob("*") if p.is_file()}
    r.solve()
    return sorted(p for p in r.workspace.rglob("*")
                  if p.is_file() and before.get(p.relative_to(r.workspace)) != p.read_bytes())


def test_an_answer_symlinked_out_of_the_workspace_is_not_accepted(file_rollout, tmp_path):
    rollout = file_rollout
    answers = _answer_files(rollout)
    assert answers, f"{rollout.task.id}: solve.sh wrote no workspace file; list it in SERVICE_ANSWERS"
    assert float(rollout.verify()["reward"]) == 1.0
    outside = tmp_path / "outside"
    outside.mkdir()
    for i, path in enumerate(answers):          # the right bytes, but behind a link that leaves the workspace
        target = outside / f"{i}-{path.name}"
        shutil.move(path, target)
        os.symlink(target, path)
    result = rollout.verify()
    assert float(result["reward"]) < 1.0, json.dumps(result, indent=1)
    assert not all(result["checks"].values())
    refused = result["details"].get("refused", {})
    assert refused and set(refused) <= {p.relative_to(rollout.workspace).as_posix() for p in answers}, result


def test_a_link_into_the_tests_folder_is_refused(tmp_path):
    """The classic forgery: the answer file is a symlink to the verifier's own fixture of the expected output."""
    task = load_task(next(p for p in TASK_DIRS if p.name == "files-dedupe-mailing-list"))
    r = Rollout(task, tmp_path)
    r.solve()
    answer = r.workspace / "subscribers_clean.txt"
    fixture = tmp_path / "tests-copy"
    shutil.copytree(task.tests_dir, fixture)
    (fixture / "expected.txt").write_bytes(answer.read_bytes())
    r.env["OPENFORGE_TESTS"] = str(fixture)
    answer.unlink()
    answer.symlink_to(fixture / "expected.txt")
    result = r.verify()
    assert result["reward"] < 1.0 and result["details"]["refused"] == {
        "subscribers_clean.txt": "a symlink out of the workspace"}


def test_generated_task_verifiers_are_isolated_too(tmp_path):
    """Generated tasks run `python3 -I -S $OPENFORGE_TESTS/verify.py` (never from the workspace); verify.py looks
    paths up with lstat, so any symlink fails its condition (tests/test_taskgen.py covers those)."""
    from rollout._taskgen._render import TEST_SH
    from tests.test_taskgen import _materialise

    assert "exec python3 -I -S " in TEST_SH and "cd " not in TEST_SH
    r = Rollout(load_task(_materialise(tmp_path / "tasks", seed=3, difficulty=2)), tmp_path / "run")
    r.solve()
    marker = tmp_path / "imported.txt"
    for name in PLANTED:
        (r.workspace / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r})\n")
    assert r.verify()["reward"] == 1.0 and not marker.exists()
