"""learner.train's watchdog over the step process: a step that keeps printing runs to its end however long it takes
(a fixed hour killed an SFT at step 106 of 120, about 8 minutes short of its end), one that goes quiet for
``stall_s`` is killed and the error says so, and ``timeout_s``, when set, still caps the whole step. A real process stands in for the step script. The
loop shows the step's progress lines in a log too, not only in a terminal's status line."""

from __future__ import annotations

import time

import pytest

from learner import TrainError
from learner._train import _run_step


def _fake_step(tmp_path, body: str):
    p = tmp_path / "python"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)
    return p


def test_a_step_that_keeps_printing_outlives_the_stall_limit(tmp_path):
    step = _fake_step(tmp_path, 'for i in 1 2 3 4 5 6; do echo "step $i/6" >&2; sleep 0.3; done\necho \'{"ok": 1}\'\n')
    lines = []
    t0 = time.monotonic()
    assert _run_step(step, [], [], None, lines.append, stall_s=1) == {"ok": 1}
    assert time.monotonic() - t0 > 1.5 and lines[-1] == "step 6/6"


def test_a_quiet_step_is_killed_and_the_error_names_the_rule(tmp_path):
    step = _fake_step(tmp_path, 'echo "step 1/9" >&2\nexec sleep 30\n')
    t0 = time.monotonic()
    with pytest.raises(TrainError, match=r"killed: it printed nothing for stall_s=1 s; pass a larger one"):
        _run_step(step, [], [], None, None, stall_s=1)
    assert time.monotonic() - t0 < 10


def test_timeout_s_still_caps_a_step_that_prints(tmp_path):
    step = _fake_step(tmp_path, 'while true; do echo "step" >&2; sleep 0.2; done\n')
    with pytest.raises(TrainError, match=r"killed: it ran past timeout_s=1 s"):
        _run_step(step, [], [], 1, None, stall_s=5)


def test_a_failing_step_is_not_called_killed(tmp_path):
    step = _fake_step(tmp_path, 'echo "error: bad shard" >&2\nexit 3\n')
    with pytest.raises(TrainError, match=r"the train step failed \(exit 3\):\nerror: bad shard") as e:
        _run_step(step, [], [], None, None, stall_s=5)
    assert "killed" not in str(e.value)


def test_the_loop_prints_the_steps_progress_in_a_log_once_a_minute_and_in_the_status_on_a_terminal():
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from openforge.loop_session import Session

    log = io.StringIO()
    session = Session(SimpleNamespace(teacher=None), Console(file=log, force_terminal=False, width=200), None, None)
    to_log = session._progress(None, "SFT -> v", every_s=3600)
    for i in range(1, 4):
        to_log(f"step {i}/3")
    assert log.getvalue() == "  SFT -> v: step 1/3\n"   # the first line at once, the rest within the minute not
    shown = []
    session = Session(SimpleNamespace(teacher=None), Console(file=io.StringIO(), force_terminal=True), None, None)
    session._progress(SimpleNamespace(update=shown.append), "SFT -> v")("step 2/3")
    assert shown == ["SFT -> v: step 2/3"]
