"""The trajectory page of a GUI rollout: each step's screenshot beside the model's action, the click drawn on it.

The rollout is recorded through ``Store.begin_call`` (screenshots sent inline as a harness sends them, moved to blobs
by the store); the page is served by ``openforge dashboard`` and loaded in headless Chromium (Debian's), where the
pixel at the click's position of the shown screenshot must be the marker's colour. The page screenshot is kept
under the test's tmp dir (its path is printed).
"""

from __future__ import annotations

import base64
import io
import json
import os
import time
from datetime import timedelta

import pytest
from PIL import Image

from dashboards._views.screenshots import COLOUR, draw_actions, pointer_actions
from forge_store import Settings, open_store
from forge_store.testing import T0
from tests.test_dashboard_e2e import CHROMIUM, devtools_page, serve_dashboard
from tests.test_screenshot_lineage import screen, sha

CLICKS = [(52, 95), (64, 95), (150, 12)]


def _tool(action: dict, i: int) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call-{i}", "type": "function", "function": {"name": "computer", "arguments": json.dumps(action)}}]}


def record_gui_rollout(store, rid: str = "gui-r1") -> list[bytes]:
    """Three steps of a computer-use rollout: each prompt resends the screenshots so far; each answer clicks."""
    shots = [screen(i) for i in range(len(CLICKS))]
    store.register_policy_version("policy-gui", model_name="demo-policy")
    store.start_rollout(rid, task_id="gui-form", harness_id=store.register_harness("computer-use", "1"),
                        policy_version_id="policy-gui", backend="local", started_at=T0)
    msgs = [{"role": "system", "content": "You operate a browser."},
            {"role": "user", "content": [{"type": "text", "text": "Submit the form."}]}]
    ids: list[int] = list(range(1, 30))
    for i, (x, y) in enumerate(CLICKS):
        url = "data:image/png;base64," + base64.b64encode(shots[i]).decode()
        msgs.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]})
        draft = store.begin_call(rid, list(msgs))
        answer = _tool({"action": "click", "x": x, "y": y}, i)
        completion = [900 + i, 901, 2]
        t = T0 + timedelta(seconds=3 * i)
        draft.start(
            id=f"{rid}-c{i}", seq=i, api_surface="chat.completions", started_at=t, ended_at=t + timedelta(seconds=2),
            model="demo-policy", response={"text": None, "tool_calls": answer["tool_calls"], "reasoning": None},
            response_message=answer, finish_reason="tool_calls", prompt_token_ids=list(ids),
            completion_token_ids=completion, completion_logprobs=[-0.1] * 3,
            usage={"prompt_tokens": len(ids), "completion_tokens": 3}, policy_version_id="policy-gui",
            token_exact=True)
        draft.finish_now()
        msgs += [answer, {"role": "tool", "tool_call_id": f"call-{i}", "content": "clicked"}]
        ids = ids + completion + [5, 6, 7]
    store.finish_rollout(rid, "success", ended_at=T0 + timedelta(seconds=10))
    store.add_reward(rid, 1.0, verifier_version="gui-1")
    return shots


def test_pointer_actions_read_the_shapes_gui_harnesses_answer_in():
    def tc(name, args):
        return {"tool_calls": [{"function": {"name": name, "arguments": json.dumps(args)}}]}

    assert [a.label for a in pointer_actions(tc("computer", {"action": "click", "x": 10, "y": 20}))] \
        == ["click(10, 20)"]
    assert pointer_actions(tc("computer", {"action": "left_click", "coordinate": [3, 4]}))[0].label \
        == "left_click(3, 4)"
    assert pointer_actions(tc("computer", {"action": {"type": "double_click", "x": 5, "y": 6}}))[0].label \
        == "double_click(5, 6)"
    assert pointer_actions(tc("click", {"x": 7, "y": 8}))[0].label == "click(7, 8)"
    typed = pointer_actions(tc("computer", {"action": "type", "text": "hi"}))
    assert [(a.name, a.x) for a in typed] == [("type", None)]  # listed, not drawn
    assert pointer_actions(tc("bash", {"command": "ls"})) == []
    assert pointer_actions({"content": 'I will press it: {"action": "click", "x": 11, "y": 12}'})[0].label \
        == "click(11, 12)"
    assert pointer_actions({"content": "pyautogui.click(x=30, y=40)"})[0].label == "pyautogui.click(30, 40)"


def test_the_click_is_drawn_at_its_position():
    png = screen(0)
    acts = pointer_actions({"tool_calls": [{"function": {"name": "computer",
                                                         "arguments": '{"action": "click", "x": 52, "y": 95}'}}]})
    img = Image.open(io.BytesIO(draw_actions(png, acts))).convert("RGB")
    assert img.size == (320, 200) and img.getpixel((52, 95)) == COLOUR
    assert Image.open(io.BytesIO(png)).convert("RGB").getpixel((52, 95)) != COLOUR
    half = pointer_actions({"content": "click(0.5, 0.25)"})  # fractions of the screenshot
    assert Image.open(io.BytesIO(draw_actions(png, half))).convert("RGB").getpixel((160, 50)) == COLOUR


@pytest.fixture
def gui_dashboard(tmp_path):
    if not os.path.exists(CHROMIUM):
        msg = f"headless Chromium not found at {CHROMIUM}: apt-get install -y chromium (make chromium)"
        pytest.fail(msg + " (required in CI)") if os.environ.get("CI") else pytest.skip(msg)
    url, home = f"sqlite:///{tmp_path / 'store.sqlite'}", tmp_path / "home"
    with open_store(url, settings=Settings(home=home)) as st:
        shots = record_gui_rollout(st)
    with serve_dashboard(url, home, tmp_path / "dashboard.log") as base:
        yield base, shots


# The colour of (x, y) in each screenshot-sized image on the page, read through a canvas (same-origin media).
_PIXELS = """(() => [...document.images].filter(i => i.naturalWidth === 320 && i.naturalHeight === 200).map(i => {
  const c = document.createElement('canvas'); c.width = 320; c.height = 200;
  const g = c.getContext('2d'); g.drawImage(i, 0, 0);
  return Array.from(g.getImageData(%d, %d, 1, 1).data.slice(0, 3)); }))()"""


@pytest.mark.e2e
def test_trajectory_page_shows_each_screenshot_beside_its_action(gui_dashboard, tmp_path):
    url, shots = gui_dashboard
    shot = tmp_path / "gui-trajectory-page.png"
    with devtools_page(tmp_path / "chromium-profile", window="1400,2200", timeout=30) as page:
        page.call("Page.enable")
        page.call("Page.navigate", url=f"{url}/?page=Trajectories&rollout=gui-r1")
        wanted = ("Screen and action", "click(52, 95)", f"screenshot {sha(shots[0])[:16]}")
        text, pixels, settled, deadline = "", [], 0, time.monotonic() + 90
        while time.monotonic() < deadline and settled < 3:
            text = page.text()
            pixels = page.call("Runtime.evaluate", expression=_PIXELS % CLICKS[0],
                               returnByValue=True)["result"].get("value") or []
            done = all(w in text for w in wanted) and pixels and not page.running()
            settled = settled + 1 if done else 0
            time.sleep(0.5)
        shot.write_bytes(base64.b64decode(page.call("Page.captureScreenshot", format="png")["data"]))
    print(f"page screenshot: {shot}")
    missing = [w for w in wanted if w not in text]
    assert not missing, f"the page lacks {missing}; screenshot: {shot}\n{text[:3000]}"
    assert "Traceback" not in text, f"screenshot: {shot}"
    # the browser colour-manages the PNG: the marker's red within a margin, far from the button's blue under it
    under = Image.open(io.BytesIO(shots[0])).convert("RGB").getpixel(CLICKS[0])
    assert pixels and all(abs(a - b) <= 40 for a, b in zip(pixels[0], COLOUR)), \
        f"no click marker at {CLICKS[0]}: {pixels}; screenshot: {shot}"
    assert sum(abs(a - b) for a, b in zip(pixels[0], under)) > 200, (pixels, under)
