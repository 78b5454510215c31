"""Screenshots as lineage, through the real proxy with the official SDKs: a GUI-like rollout resends every earlier
screenshot each turn (as computer-use harnesses do), on chat completions, Responses and Messages.

Every screenshot must be one content-addressed blob, stored once however many prompts carry it; each call must list
the hashes of the screenshots in its prompt, in prompt order; the stored prompt holds references, not base64. The
veRL export must carry the images the way veRL's multimodal agent loops take them (``multi_modal_data.images``
per trajectory row, ``images`` + ``<image>`` placeholders in the RL prompt rows).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json

import anthropic
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from PIL import Image, ImageDraw

from learner._export import export
from learner._plan import ExportConfig
from proxy.engines.scripted import ToolCall, ToolCalls
from tests.proxy_fixtures import px, up  # noqa: F401  (fixtures)

STEPS = 5
COMPUTER = {"type": "object", "properties": {"action": {"type": "string"}, "x": {"type": "integer"},
                                             "y": {"type": "integer"}}, "required": ["action"]}


def screen(step: int, seed: int = 0) -> bytes:
    """A small GUI-like screenshot: a window, a toolbar and a button that moves a little each step."""
    img = Image.new("RGB", (320, 200), (236, 239, 244))
    d = ImageDraw.Draw(img)
    d.rectangle((0, 0, 319, 24), fill=(52, 73, 94))
    d.text((8, 6), f"Inbox - step {step}", fill=(255, 255, 255))
    d.rectangle((20 + 12 * step, 80, 120 + 12 * step, 110), fill=(41, 128, 185 - 20 * seed))
    d.text((30 + 12 * step, 90), "Submit", fill=(255, 255, 255))
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _script(px, steps: int) -> None:
    px.up.double.script.extend(ToolCalls([ToolCall("computer", {"action": "click", "x": 40 + 12 * i, "y": 95})])
                               for i in range(steps))


def run_chat(px, rid: str, shots: list[bytes], **register) -> None:
    client = px.client(px.register(rid, **register))
    tools = [{"type": "function", "function": {"name": "computer", "parameters": COMPUTER}}]
    msgs = [{"role": "system", "content": "You operate a desktop."},
            {"role": "user", "content": [{"type": "text", "text": "Press Submit."},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                                             + _b64(shots[0])}}]}]
    for i in range(len(shots)):
        msg = client.chat.completions.create(model="m", messages=msgs, tools=tools).choices[0].message
        if i + 1 == len(shots):
            return
        msgs.append(msg.model_dump(exclude_none=True))
        msgs.append({"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "clicked"})
        msgs.append({"role": "user", "content": [{"type": "image_url", "image_url": {
            "url": "data:image/png;base64," + _b64(shots[i + 1])}}]})


def run_responses(px, rid: str, shots: list[bytes]) -> None:
    client = px.client(px.register(rid))
    tools = [{"type": "function", "name": "computer", "parameters": COMPUTER}]
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Press Submit."},
                                          {"type": "input_image", "image_url": "data:image/png;base64,"
                                           + _b64(shots[0])}]}]
    for i in range(len(shots)):
        resp = client.responses.create(model="m", input=items, tools=tools)
        if i + 1 == len(shots):
            return
        call = next(o for o in resp.output if o.type == "function_call")
        items += [o.model_dump(exclude_none=True) for o in resp.output]
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": "clicked"})
        items.append({"role": "user", "content": [{"type": "input_image",
                                                   "image_url": "data:image/png;base64," + _b64(shots[i + 1])}]})


def run_messages(px, rid: str, shots: list[bytes]) -> None:
    client = anthropic.Anthropic(base_url=px.url, api_key=px.register(rid), max_retries=0)
    tools = [{"name": "computer", "input_schema": COMPUTER}]

    def image(data: bytes) -> dict:
        return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _b64(data)}}

    msgs = [{"role": "user", "content": [{"type": "text", "text": "Press Submit."}, image(shots[0])]}]
    for i in range(len(shots)):
        m = client.messages.create(model="m", max_tokens=64, messages=msgs, tools=tools)
        if i + 1 == len(shots):
            return
        use = next(b for b in m.content if b.type == "tool_use")
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                  "content": [{"type": "text", "text": "clicked"},
                                                              image(shots[i + 1])]}]})


def _blob_rows(px) -> list[tuple[str, int]]:
    engine = sa.create_engine(px.store.url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT sha256, size FROM blobs WHERE media_type = 'image/png'")).all()
    engine.dispose()
    return [tuple(r) for r in rows]


@pytest.mark.parametrize("surface,run", [("chat.completions", run_chat), ("responses", run_responses),
                                         ("messages", run_messages)])
def test_every_screenshot_is_one_blob_and_every_call_names_its_screenshots(px, surface, run):
    shots = [screen(i) for i in range(STEPS)]
    _script(px, STEPS)
    run(px, "gui", shots)
    calls = px.calls("gui")
    assert [c.api_surface for c in calls] == [surface] * STEPS
    for i, c in enumerate(calls):
        assert c.image_hashes == [sha(s) for s in shots[:i + 1]], (i, c.image_hashes)
        assert all(_b64(s) not in json.dumps(c.messages) for s in shots)  # references, never the bytes
        assert c.token_exact and c.prompt_token_ids
    for s in shots:
        assert px.store.get_blob(sha(s)) == s
    rows = _blob_rows(px)
    assert sorted(rows) == sorted((sha(s), len(s)) for s in shots)  # once each, however many prompts carry it
    stored = sum(size for _, size in rows)
    naive = sum(len(s) for i in range(STEPS) for s in shots[:i + 1])
    print(f"{surface}: {STEPS} steps, screenshot bytes stored {stored}, every prompt in full {naive}, "
          f"ratio {stored / naive:.3f}")
    assert stored / naive == pytest.approx(sum(map(len, shots)) / naive)


def test_verl_export_carries_the_screenshots(px, tmp_path):
    shots = {rid: [screen(i, seed) for i in range(3)] for seed, rid in enumerate(("gui-a", "gui-b"))}
    px.store.register_task("gui-task", domain="gui")
    px.store.create_group("g-gui", task_id="gui-task", target_size=2)
    for rid, imgs in shots.items():
        _script(px, len(imgs))
        run_chat(px, rid, imgs, group_id="g-gui", task_id="gui-task")
        px.end(rid, "success")
    px.store.add_reward("gui-a", 1.0, verifier_version="v1")
    px.store.add_reward("gui-b", 0.0, verifier_version="v1")
    assert px.store.flush(30)
    m = export(px.store, tmp_path / "out", ExportConfig(format="verl"))
    assert m["counts"]["rollouts_exported"] == 2, (m["counts"], m.get("exclusions"))
    traj = pq.read_table(sorted((tmp_path / "out").glob("trajectories-*.parquet"))[0]).to_pylist()
    assert traj
    for row in traj:
        calls = {c.id: c for c in px.store.calls(row["rollout_id"])}
        last = calls[row["call_ids"][-1]]
        images = row["multi_modal_data"]["images"]
        assert [i["path"] for i in images] == [f"sha256:{h}" for h in last.image_hashes]
        assert [i["bytes"] for i in images] == shots[row["rollout_id"]][:len(images)] and images
    (prompt_row,) = pq.read_table(sorted((tmp_path / "out").glob("rl_prompts-*.parquet"))[0]).to_pylist()
    text = "".join(m["content"] for m in prompt_row["prompt"])
    assert text.count("<image>") == len(prompt_row["images"]) == 1 and "Press Submit." in text
    assert prompt_row["images"][0]["bytes"] in (shots["gui-a"][0], shots["gui-b"][0])
