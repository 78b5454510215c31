"""The computer-use harness: its action parser (no browser), its actions performed in a real headless Chromium on
the host, its adapter (what runs in the sandbox, what it needs installed, the pod a GUI rollout becomes on
Kubernetes), and two more ways through a real sandbox: the Responses API (the proxy's translation) and a headed
Chromium on a virtual X display (Xvfb)."""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

import pytest

from learner import reconstruct
from proxy.engines.scripted import steps_from_actions
from rollout import get_harness, load_tasks
from rollout._backends.base import Phase, Resources, SandboxError, SandboxSpec
from rollout._harnesses.base import LaunchContext
from rollout._harnesses.computer_use import DIR, PLAYWRIGHT_VERSION, ComputerUseHarness
from rollout._harnesses.computer_use_actions import ActionError, action_in_text, normalize_keys, parse_action, perform

ROOT = Path(__file__).resolve().parents[1]
GUI = ROOT / "examples" / "gui-tasks"
W, H = 1024, 768


def _parse(args):
    return parse_action(args, width=W, height=H)


@pytest.mark.parametrize("args, want", [
    ({"action": "click", "x": 10, "y": 20}, ("click", 10, 20)),
    ({"type": "click", "x": 10.4, "y": "20"}, ("click", 10, 20)),                  # OpenAI computer-use shape
    ({"action": "left_click", "coordinate": [5, 6]}, ("click", 5, 6)),             # Anthropic computer tool shape
    ({"action": "double_click", "x": 1, "y": 2}, ("double_click", 1, 2)),
    ('{"action": "click", "x": 1023, "y": 767}', ("click", 1023, 767)),           # arguments as JSON text
])
def test_clicks(args, want):
    a = _parse(args)
    assert (a.kind, a.x, a.y) == want


def test_right_click_keeps_its_button():
    assert _parse({"action": "right_click", "x": 3, "y": 4}).button == "right"
    with pytest.raises(ActionError, match="left, right or middle"):
        _parse({"action": "click", "x": 3, "y": 4, "button": "thumb"})


@pytest.mark.parametrize("args, says", [
    ({"action": "click", "x": 1024, "y": 10}, r"outside the 1024x768 screenshot; x must be in 0..1023"),
    ({"action": "click", "x": -1, "y": 10}, "outside"),
    ({"action": "click", "y": 10}, "integer 'x'"),
    ({"action": "click", "x": True, "y": 10}, "integer 'x'"),
    ({"action": "fly"}, "unknown; use one of click, double_click, type, key, scroll, navigate, wait, done"),
    ({"x": 1}, 'no "action"'),
    ({"action": "type", "text": ""}, "non-empty"),
    ({"action": "type", "text": "x" * 2001}, "at most 2000"),
    ({"action": "navigate", "url": "file:///etc/passwd"}, "http"),
    ({"action": "scroll", "x": 1, "y": 1}, "not all zero"),
    ({"action": "scroll", "direction": "sideways"}, "up, down, left or right"),
    ({"action": "key", "key": "hyper+q"}, "not a key name"),
    ("{not json", "not valid JSON"),
    (["click"], "JSON object"),
])
def test_a_bad_action_says_what_to_fix(args, says):
    with pytest.raises(ActionError, match=re.escape(says) if "\\" not in says else says):
        _parse(args)


@pytest.mark.parametrize("spec, want", [
    ("ctrl+a", ("Control", "a")), ("Return", ("Enter",)), (["CTRL", "SHIFT", "T"], ("Control", "Shift", "t")),
    ("Escape", ("Escape",)), ("page_down", ("PageDown",)), ("F5", ("F5",)), ("A", ("A",)), ("+", ("+",)),
    ("ArrowDown", ("ArrowDown",)), ("cmd + c", ("Meta", "c")),
])
def test_key_names_become_playwrights(spec, want):
    assert normalize_keys(spec) == want
    assert _parse({"action": "key", "keys" if isinstance(spec, list) else "key": spec}).keys == want


def test_scroll_navigate_wait_done():
    s = _parse({"action": "scroll", "direction": "down", "amount": 2})
    assert (s.x, s.y, s.dx, s.dy) == (W // 2, H // 2, 0, 200)
    assert _parse({"action": "scroll", "x": 5, "y": 6, "scroll_y": -300}).dy == -300
    assert _parse({"action": "goto", "url": "http://127.0.0.1:8080/"}).url == "http://127.0.0.1:8080/"
    assert _parse({"action": "wait", "ms": 99_999}).ms == 5000
    assert _parse({"action": "done", "answer": "Saved."}).text == "Saved."


def test_an_action_written_in_text_is_read_and_plain_text_is_none():
    a = action_in_text('I will click Save.\n```json\n{"action": "click", "x": 330, "y": 342}\n```', width=W, height=H)
    assert (a.kind, a.x, a.y) == ("click", 330, 342)
    assert action_in_text("All done, the settings are saved.", width=W, height=H) is None
    assert action_in_text('{"note": "no action key"}', width=W, height=H) is None


def test_every_gui_task_script_parses():
    for t in load_tasks(GUI):
        for a in t.solution_actions[:-1]:
            _parse(a["arguments"])


# --- the adapter --------------------------------------------------------------------------------------------------
def test_launch_runs_the_agent_from_its_venv_with_the_scripts_mounted(tmp_path):
    h = ComputerUseHarness(cache_dir=tmp_path, api="responses", display="xvfb", keep_screenshots=3)
    launch = h.launch(LaunchContext(instruction="Do it.", base_url="http://127.0.0.1:8000", token="tok", model="m",
                                    workdir="/workspace", home="/home/agent", max_turns=7))
    argv = list(launch.argv)
    assert argv[:2] == [f"{tmp_path}/computer-use/bin/python", f"{DIR}/computer_use_agent.py"]
    assert argv[argv.index("--api") + 1] == "responses" and argv[argv.index("--display") + 1] == "xvfb"
    assert argv[argv.index("--max-turns") + 1] == "7" and argv[argv.index("--keep-screenshots") + 1] == "3"
    assert "tok" not in argv and launch.env["OPENAI_API_KEY"] == "tok" and launch.env["OPENFORGE_SHM_MB"] == "512"
    targets = {m.target: m.source for m in launch.mounts}
    assert targets[str(tmp_path / "computer-use")] == tmp_path / "computer-use"
    for f in ("computer_use_agent.py", "computer_use_actions.py"):
        assert targets[f"{DIR}/{f}"].is_file()
    assert launch.files == (("/home/agent/instruction.md", b"Do it.", 0o644),)


def test_missing_installs_are_named_with_their_make_targets(tmp_path):
    h = ComputerUseHarness(cache_dir=tmp_path, chromium=str(tmp_path / "no-chromium"), display="xvfb")
    assert not h.is_installed()
    hint = h.install_hint()
    assert "make computer-use" in hint and "make chromium" in hint
    assert h.version() == "1.0+playwright-unknown"
    for bad in ({"api": "grpc"}, {"display": "vnc"}, {"image_format": "gif"}):
        with pytest.raises(ValueError, match="use"):
            ComputerUseHarness(cache_dir=tmp_path, **bad)


@pytest.mark.parametrize("code, kind", [(0, "finished"), (3, "finished"), (4, "context_exceeded"), (5, "infra"),
                                        (6, "error"), (7, "infra"), (1, "error")])
def test_exit_codes(tmp_path, code, kind):
    """7: the browser never started, before any model call: the sandbox's failure (retried), not the policy's."""
    from rollout._backends.base import PhaseResult

    assert ComputerUseHarness(cache_dir=tmp_path).classify(PhaseResult("harness", code)).kind == kind


def test_the_playwright_pin_is_one_version_everywhere():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["gui"] == [f"playwright=={PLAYWRIGHT_VERSION}"]
    assert f"PLAYWRIGHT_VERSION ?= {PLAYWRIGHT_VERSION}" in (ROOT / "Makefile").read_text()


def test_a_gui_rollout_is_a_valid_pod_with_shared_memory_for_the_browser(tmp_path):
    kv = pytest.importorskip("kubernetes_validate")
    from rollout._backends.kubernetes import KubernetesConfig, manifests
    from rollout._verifier import verifier_phase

    task = next(t for t in load_tasks(GUI) if t.id == "gui-settings-profile")
    h = ComputerUseHarness(cache_dir=tmp_path)
    launch = h.launch(LaunchContext(instruction=task.instruction, base_url="http://openforge-proxy.openforge.svc:8000",
                                    token="tok-1", model="m", workdir="/workspace", home="/home/openforge"))
    services = [Phase(f"service:{s.name}", tuple(s.command), timeout_s=s.ready_timeout_sec, background=True,
                      ready_port=s.port) for s in task.config.environment.services]
    harness = Phase("harness", launch.argv, env=dict(launch.env), timeout_s=300, files=launch.files)
    spec = SandboxSpec(rollout_id="ro-gui-1", run_id="run-1", group_id="g-1", task_id=task.id,
                       workspace_seed=None, environment_dir=task.environment_dir,
                       phases=(*services, harness, verifier_phase(task)), image=task.config.environment.docker_image,
                       resources=Resources(cpus=1, memory_mb=2048), mounts=launch.mounts, proxy_token="tok-1")
    # the venv is the image's (a pod cannot carry it in a ConfigMap); the two scripts ship with the pod
    cfg = KubernetesConfig(namespace="openforge-test", image_provides=[str(h.venv)])
    pod, secret, cms, plan = manifests.build(spec, cfg, "ghcr.io/example/gui@sha256:" + "b" * 64)
    for m in (pod, secret, *cms):
        kv.validate(m, kv.latest_version(), strict=True)
    containers = {c["name"]: c for c in pod["spec"]["initContainers"] + pod["spec"]["containers"]}
    cname = plan.containers["harness"][0]
    shm = [m for m in containers[cname]["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == shm[0]["name"]]
    assert vol["emptyDir"] == {"medium": "Memory", "sizeLimit": "512Mi"}
    assert not any(m["mountPath"] == "/dev/shm" for c in containers.values() if c["name"] != cname
                   for m in c["volumeMounts"])
    bad = SandboxSpec(**{**spec.__dict__, "phases": (Phase("harness", ("x",), env={"OPENFORGE_SHM_MB": "lots"}),
                                                     verifier_phase(task))})
    with pytest.raises(SandboxError, match="OPENFORGE_SHM_MB='lots' must be a size in MiB"):
        manifests.build(bad, cfg, "img")


# --- a real browser ----------------------------------------------------------------------------------------------
def _chromium() -> str:
    path = "/usr/lib/chromium/chromium"
    if not Path(path).exists():
        msg = "Chromium is missing: `make chromium`"
        pytest.fail(msg) if os.environ.get("CI") else pytest.skip(msg)
    return path


PAGE = """<!doctype html><body style="margin:0;height:3000px;font:16px sans-serif">
<input id="a" style="position:absolute;left:100px;top:100px;width:300px;height:30px" value="old text">
<a id="go" href="/next" style="position:absolute;left:100px;top:200px;width:100px;height:30px;display:block">next</a>
<div id="k" style="position:absolute;left:0;top:0">keys</div>
<script>document.addEventListener('keydown', e => document.getElementById('k').textContent += ' ' + e.key);</script>
</body>"""


def test_actions_in_a_real_headless_chromium():
    """Click, select-all, type, key, scroll (exact pixels: smooth scrolling is off) and a link that navigates:
    ``perform`` returns only once the new page has loaded."""
    pw = pytest.importorskip("playwright.sync_api", reason="the gui extra: pip install -e '.[gui]'")
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Pages(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = (PAGE if self.path == "/" else "<title>next page</title>").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Pages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/"
    try:
        with pw.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=_chromium(), args=["--disable-smooth-scrolling"])
            page = browser.new_page(viewport={"width": W, "height": H})
            for args in ({"action": "navigate", "url": url}, {"action": "click", "x": 250, "y": 115},
                         {"action": "key", "key": "ctrl+a"}, {"action": "type", "text": "new"},
                         {"action": "key", "key": "Return"}):
                perform(page, _parse(args))
            assert page.input_value("#a") == "new" and page.text_content("#k").endswith("Enter")
            perform(page, _parse({"action": "scroll", "x": 500, "y": 400, "scroll_y": 880}))
            assert page.evaluate("window.scrollY") == 880
            perform(page, _parse({"action": "scroll", "direction": "up", "amount": 9}))
            assert page.evaluate("window.scrollY") == 0
            perform(page, _parse({"action": "click", "x": 150, "y": 215}))
            assert page.title() == "next page" and page.url == url + "next"
            browser.close()
    finally:
        server.shutdown()


# --- through a real sandbox: the Responses API, and a headed browser on Xvfb --------------------------------------
@pytest.mark.e2e
@pytest.mark.parametrize("options, surface", [({"api": "responses"}, "responses"),
                                              ({"display": "xvfb"}, "chat.completions")])
def test_a_gui_task_through_the_responses_api_and_on_a_virtual_display(forge, options, surface):
    h = get_harness("computer-use", **options)
    if not h.is_installed():
        msg = f"the computer-use harness is not installed: {h.install_hint()}"
        pytest.fail(msg) if os.environ.get("CI") else pytest.skip(msg)
    task = next(t for t in load_tasks(GUI) if t.id == "gui-todo-cleanup")
    forge.up.double.conversations.add(task.instruction, steps_from_actions(task.solution_actions))
    (res,) = forge.run([task], h).results
    assert (res.outcome, res.reward) == ("success", 1.0), res.detail[-1500:]
    calls = forge.store.calls(res.rollout_id)
    assert len(calls) == len(task.solution_actions) and {c.api_surface for c in calls} == {surface}
    # every screenshot is kept in the history (keep_screenshots=0): each prompt extends the last, one sample
    assert len(reconstruct(calls)) == 1


# --- browser-use: a third-party browser agent, unmodified, in the same sandbox ------------------------------------
def _bu(action: dict) -> dict:
    return {"evaluation_previous_goal": "", "memory": "", "next_goal": "", "action": [action]}


BOOKING_BY_BROWSER_USE = [   # browser-use's own action shapes; clicks at x,y (its coordinate-clicking mode)
    _bu({"navigate": {"url": "http://127.0.0.1:8080/"}}),
    *(_bu({"click": {"coordinate_x": x, "coordinate_y": y}}) for x, y in ((525, 118), (555, 168), (605, 218),
                                                                           (460, 268))),
    _bu({"send_keys": {"keys": "Design review"}}), _bu({"click": {"coordinate_x": 330, "coordinate_y": 332}}),
    _bu({"done": {"text": "Booked Room B on Wednesday at 14:00.", "success": True}}),
]


@pytest.mark.e2e
def test_browser_use_unmodified_books_the_room_in_the_sandbox(forge):
    """browser-use from PyPI, offline, on Debian's Chromium inside bubblewrap, its model calls through the proxy
    (screenshots as image parts, so blobs in the store), scored by the task's own verifier."""
    import json

    from proxy.engines.scripted import Text

    h = get_harness("browser-use")
    if not h.is_installed():
        msg = f"browser-use is not installed: {h.install_hint()}"
        pytest.fail(msg) if os.environ.get("CI") else pytest.skip(msg)
    task = next(t for t in load_tasks(GUI) if t.id == "gui-room-booking")
    # browser-use sends each step as a fresh prompt (its history summarised in text, no assistant turns), so the
    # per-conversation script (which counts assistant turns) does not apply: the flat script answers in order
    forge.up.double.max_model_len = 262_144        # its prompts are ~7k tokens and it asks for 4096 more
    forge.up.double.script.extend([Text(json.dumps(s)) for s in BOOKING_BY_BROWSER_USE])
    (res,) = forge.run([task], h).results
    calls = forge.store.calls(res.rollout_id)
    assert (res.outcome, res.reward) == ("success", 1.0), (res.detail[-2000:], res.extra.get("evidence"),
                                                           [(c.upstream_status, c.error_detail) for c in calls])
    assert len(calls) == len(BOOKING_BY_BROWSER_USE)
    parts = [p for m in calls[-1].messages if isinstance(m.get("content"), list) for p in m["content"]]
    assert any(p.get("type") == "image_url" and "openforge-blob:sha256:" in p["image_url"]["url"] for p in parts)


def test_browser_use_launch_and_hint(tmp_path):
    from rollout._harnesses.computer_use_browser_use import BrowserUseHarness

    h = BrowserUseHarness(cache_dir=tmp_path)
    launch = h.launch(LaunchContext(instruction="Book it.", base_url="http://127.0.0.1:8000", token="tok", model="m",
                                    workdir="/workspace", home="/home/agent"))
    assert launch.argv[0] == f"{tmp_path}/browser-use/bin/python" and "--coordinate-clicking" in launch.argv
    assert "tok" not in launch.argv and launch.env["OPENAI_API_KEY"] == "tok"
    assert launch.env["ANONYMIZED_TELEMETRY"] == "false" and all(m.source.exists() for m in launch.mounts[1:])
    assert not h.is_installed() and "make browser-use" in h.install_hint() and h.version() == "unknown"


# --- the conversation the harness keeps (no browser, no server: its HTTP post replaced) ---------------------------
def _agent(monkeypatch, answers: list[dict]):
    from types import SimpleNamespace

    from rollout._harnesses import computer_use_agent as agent

    sent = []

    def post(url, key, body, **_):
        sent.append((url, json.loads(json.dumps(body))))
        return answers[len(sent) - 1]

    monkeypatch.setattr(agent, "post", post)
    args = SimpleNamespace(model="m", base_url="http://proxy", key="k", width=W, height=H, max_tokens=None,
                           temperature=None, keep_screenshots=2)
    return agent, args, sent


def test_chat_keeps_the_last_screenshots_and_answers_every_tool_call(monkeypatch):
    calls = [{"id": "a", "type": "function", "function": {"name": "computer", "arguments": '{"action": "wait"}'}},
             {"id": "b", "type": "function", "function": {"name": "computer", "arguments": '{"action": "done"}'}}]
    answer = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": calls}}]}
    agent, args, sent = _agent(monkeypatch, [answer] * 3)
    convo = agent.ChatConversation(args, "Do the task.")
    for i in range(3):
        convo.add_screen(f"data:image/png;base64,{i}", f"Screen {i}:")
        raw, call_id, _ = convo.ask()
        assert call_id == "a" and parse_action(raw["__arguments"], width=W, height=H).kind == "wait"
        convo.result(call_id, "waited")
    msgs = sent[-1][1]["messages"]
    assert msgs[1]["content"][0] == {"type": "text", "text": "Do the task."}        # the instruction, once, first
    images = [p for m in msgs if isinstance(m.get("content"), list) for p in m["content"] if p["type"] == "image_url"]
    assert [p["image_url"]["url"][-1] for p in images] == ["1", "2"]                 # keep_screenshots=2
    assert agent.OMITTED in json.dumps(msgs[1])
    tools = [m for m in convo.messages if m["role"] == "tool"]
    assert [t["tool_call_id"] for t in tools] == ["a", "b"] * 3 and "one action per turn" in tools[1]["content"]


def test_responses_understands_a_native_computer_call(monkeypatch):
    """An upstream with OpenAI's computer-use tool answers computer_call items: the action is read from it and the
    next screenshot goes back as its computer_call_output."""
    native = {"output": [{"type": "computer_call", "call_id": "cu1", "action": {"type": "click", "x": 7, "y": 9}}]}
    text = {"output": [{"type": "message", "content": [{"type": "output_text", "text": "All done."}]}]}
    agent, args, sent = _agent(monkeypatch, [native, text])
    convo = agent.ResponsesConversation(args, "Do the task.")
    convo.add_screen("data:image/png;base64,AA", "Screen 1:")
    raw, call_id, _ = convo.ask()
    a = parse_action(raw, width=W, height=H)
    assert (a.kind, a.x, a.y, call_id) == ("click", 7, 9, None)
    convo.result(call_id, a.describe())
    convo.add_screen("data:image/png;base64,BB", "Screen 2:")
    assert convo.items[-1] == {"type": "computer_call_output", "call_id": "cu1",
                               "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,BB"}}
    raw, call_id, answer = convo.ask()
    assert raw is None and answer == "All done." and sent[0][0] == "http://proxy/v1/responses"
    assert sent[0][1]["input"][0]["content"][-1] == {"type": "input_image", "image_url": "data:image/png;base64,AA"}
