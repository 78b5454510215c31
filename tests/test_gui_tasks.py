"""GUI tasks end to end: every task of ``examples/gui-tasks`` in a real bubblewrap sandbox, its web app a task
service on the sandbox's own loopback, the ``computer-use`` harness driving Debian's Chromium through Playwright, and
the model played by the scripted engine (``proxy.engines.scripted.Conversations``: it stands in for a vision model served by
vLLM, answering each turn with the next action of the task's script). The reference script
(``solution/actions.json``) reaches 1.0 on every task and the near-miss script (``solution/wrong_actions.json``)
0.0, both scored by the task's verifier from the app's state; every screenshot reaches the store as an image blob.

Needs bubblewrap (``make sandbox``), Chromium (``make chromium``) and the harness's venv (``make computer-use``):
skipped without them on a laptop, failed in CI.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from proxy.engines.scripted import steps_from_actions
from rollout import get_harness, load_tasks
from rollout._task import Task

pytestmark = pytest.mark.e2e

GUI = Path(__file__).resolve().parents[1] / "examples" / "gui-tasks"
PNG = b"\x89PNG\r\n\x1a\n"
BLOB = "openforge-blob:sha256:"


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return load_tasks(GUI)


@pytest.fixture
def harness():
    h = get_harness("computer-use")
    if not h.is_installed():
        msg = f"the computer-use harness is not installed: {h.install_hint()}"
        pytest.fail(msg) if os.environ.get("CI") else pytest.skip(msg)
    return h


def test_eight_gui_tasks_each_with_a_reference_and_a_wrong_script(tasks):
    assert len(tasks) >= 8
    for t in tasks:
        assert t.domain == "gui" and t.config.environment.services, t.id
        wrong = json.loads((t.path / "solution" / "wrong_actions.json").read_text())
        assert steps_from_actions(wrong) and wrong != list(t.solution_actions), t.id
        kinds = {a["arguments"]["action"] for a in t.solution_actions[:-1]}
        assert {a["tool"] for a in t.solution_actions[:-1]} == {"computer"} and "navigate" in kinds, t.id
    # each task carries its own copy of the web app (self-contained folders); the copies agree with the source
    source = (GUI / "gui_webapp.py").read_bytes()
    stale = [t.id for t in tasks if (t.path / "environment" / "gui_webapp.py").read_bytes() != source]
    assert not stale, f"{stale}: environment/gui_webapp.py differs from examples/gui-tasks/; make gui-tasks-sync"
    # and the helpdesk API they drive is the one the text-only helpdesk tasks run
    service = (GUI.parent / "tasks" / "helpdesk-assign-by-load" / "environment" / "helpdesk_service.py").read_bytes()
    copies = [t.path / "environment" / "helpdesk_service.py" for t in tasks]
    assert all(c.read_bytes() == service for c in copies if c.exists()) and any(c.exists() for c in copies)


def _script(forge, tasks: list[Task], which: str) -> None:
    convo = forge.up.double.conversations
    convo.clear()
    for t in tasks:
        actions = (t.solution_actions if which == "actions.json"
                   else json.loads((t.path / "solution" / which).read_text()))
        convo.add(t.instruction, steps_from_actions(actions))


def _images(store, rollout_id: str) -> list[bytes]:
    """The screenshots of the rollout's last call, read back from the store's blobs."""
    calls = store.calls(rollout_id)
    out = []
    for m in calls[-1].messages:
        for part in m.get("content") if isinstance(m.get("content"), list) else []:
            if part.get("type") == "image_url":
                url = part["image_url"]["url"]    # data:image/png;base64,openforge-blob:sha256:<hex>
                ref = url.partition(",")[2]
                assert url.startswith("data:image/png;base64,") and ref.startswith(BLOB), url[:80]
                out.append(store.get_blob(ref.removeprefix(BLOB)))
    return out


def test_reference_scripts_solve_every_task_and_wrong_scripts_fail(forge, tasks, harness):
    _script(forge, tasks, "actions.json")
    summary = forge.run(tasks, harness, concurrency=2)
    got = {r.task_id: (r.outcome, r.reward) for r in summary.results}
    assert got == {t.id: ("success", 1.0) for t in tasks}, [(r.task_id, r.detail[-800:]) for r in summary.results
                                                             if r.reward != 1.0]
    by_task = {t.id: t for t in tasks}
    for r in summary.results:
        t = by_task[r.task_id]
        calls = forge.store.calls(r.rollout_id)
        assert len(calls) == len(t.solution_actions), r.task_id      # one model call per action, then done
        shots = _images(forge.store, r.rollout_id)
        assert len(shots) == len(t.solution_actions) and all(s.startswith(PNG) for s in shots), r.task_id
        assert all(c.prompt_token_ids for c in calls), r.task_id       # token-exact through the proxy
    _script(forge, tasks, "wrong_actions.json")
    summary = forge.run(tasks, harness, concurrency=2)
    got = {r.task_id: (r.outcome, r.reward) for r in summary.results}
    assert got == {t.id: ("failure", 0.0) for t in tasks}, [(r.task_id, r.detail[-800:]) for r in summary.results]


def test_the_browser_in_the_sandbox_reaches_its_own_loopback_only(forge, tasks, harness):
    """The sandbox's network is its own loopback (the task's apps) plus the relay to the proxy: a server on the
    host's loopback and an outside address are both out of the browser's reach, and the harness tells the model."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    hits = []

    class Record(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Record)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    task = next(t for t in tasks if t.id == "gui-todo-cleanup")
    forge.up.double.conversations.add(task.instruction, steps_from_actions([
        {"tool": "computer", "arguments": {"action": "navigate", "url": f"http://127.0.0.1:{server.server_port}/x"}},
        {"tool": "computer", "arguments": {"action": "navigate", "url": "http://192.0.2.10/"}},
        {"answer": "Done."}]))
    try:
        (res,) = forge.run([task], harness).results
    finally:
        server.shutdown()
    assert (res.outcome, res.reward) == ("failure", 0.0) and hits == [], res.detail[-2000:]
    tool_results = [m["content"] for m in forge.store.calls(res.rollout_id)[-1].messages if m["role"] == "tool"]
    assert len(tool_results) == 2 and all(r.startswith("Error: opened http") for r in tool_results), tool_results
    assert "ERR_CONNECTION_REFUSED" in tool_results[0], tool_results[0]
