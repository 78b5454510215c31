"""GUI storage: what 30-step screenshot rollouts cost the store, and what a browser costs a sandbox's start.

1. Screenshots: Debian's headless Chromium (driven by Playwright, the computer-use harness's) renders a small local
   web app (a ticket list with a toolbar) and changes it a little each step (a row selected, a counter, a status
   line), capturing one PNG per step: real screenshots, mostly alike from step to step, as a GUI agent sees them.
2. Rollouts: ``--rollouts`` rollouts of ``--steps`` steps each, every one with its own screenshots, sent with the
   official ``openai`` SDK as ``image_url`` parts through the real recording proxy (its own HTTP server, a fresh
   SQLite store with its journal) to the scripted engine double, which answers each step with a ``computer`` click.
   Each prompt resends the whole history, every earlier screenshot included (what computer-use harnesses do
   unless told to keep only the last few). Storage ratio = screenshot bytes in the store (the ``blobs`` index,
   each blob once) / the bytes of every prompt's screenshots stored in full (target <= 0.1).
3. Hashing and blob writes: sha256 over the captured screenshots (screenshots/s, MB/s), and ``Store.put_blob`` of
   distinct screenshot-sized blobs into a fresh store (blobs/s, MB/s; the first write of each, the expensive case),
   opened as the proxy opens it (journal) and without a journal (one index commit per blob).
4. Sandbox start with a browser: the local backend (bubblewrap) creates a sandbox, then Chromium runs headless in
   it until it has written a screenshot of a local page (``--screenshot``): plain bubblewrap + ``chromium
   --headless`` through ``LocalBackend.create`` / ``exec``, without the computer-use harness's Playwright start;
   ``sandbox_create_ms`` and ``browser_first_screenshot_ms`` are reported apart.

Prints one JSON object (the last line). Never asserts times; the machine may be shared.

Usage: python bench/gui_storage.py [--steps 30] [--rollouts 3] [--sandboxes 3]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_BIN = "/usr/lib/chromium/chromium"
PAGE = """<!doctype html><html><head><style>
body{font:14px sans-serif;margin:0;background:#eef1f5} header{background:#34495e;color:#fff;padding:10px 16px}
table{border-collapse:collapse;margin:16px;width:760px} td{border-bottom:1px solid #ccd;padding:7px}
tr.sel{background:#d6eaf8} #status{margin:0 16px;color:#555} button{margin:0 16px;padding:6px 14px}
</style></head><body><header>Helpdesk &middot; <span id="count">0</span> tickets reviewed</header>
<table id="t"></table><button>Close ticket</button><p id="status">ready</p><script>
const t=document.getElementById('t');
for(let i=0;i<12;i++){t.insertAdjacentHTML('beforeend',
 `<tr><td>#${4100+i}</td><td>Order ${i*7+3} has not arrived</td><td>open</td><td>${(i*37)%60} min</td></tr>`)}
function step(n){document.querySelectorAll('tr').forEach((r,i)=>r.className=(i===n%12)?'sel':'');
 document.getElementById('count').textContent=n;
 const row=t.rows[n%12]; if(n%3===2) row.cells[2].textContent='closed';
 document.getElementById('status').textContent='step '+n+': selected ticket #'+(4100+n%12);}
</script></body></html>"""


def capture_screens(n: int, work: Path, seed: int) -> list[bytes]:
    """``n`` screenshots of the page, one per step (``seed`` shifts the steps: another rollout, other screens)."""
    from playwright.sync_api import sync_playwright

    page_file = work / "app.html"
    page_file.write_text(PAGE)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 800, "height": 600})
            page.goto(page_file.as_uri())
            page.wait_for_function("typeof step === 'function'")
            shots = []
            for i in range(n):
                page.evaluate(f"step({seed * 100 + i})")  # every rollout its own
                shots.append(page.screenshot(type="png"))
            return shots
        finally:
            browser.close()


def _serve_proxy(upstream_url: str, home: Path, store_url: str):
    from forge_store import Settings
    from proxy import HttpServer, build_proxy

    proxy = build_proxy(upstream_url, settings=Settings(home=home), store_url=store_url)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = HttpServer(proxy.app, max_body=proxy.app.service.max_body, graceful_s=2)
    server.start_in_thread([sock])
    return proxy, server, f"http://127.0.0.1:{sock.getsockname()[1]}"


def record_rollouts(screens: list[list[bytes]], work: Path) -> dict:
    import httpx
    import openai
    import sqlalchemy as sa

    from proxy.engines.scripted import ScriptedUpstream, ToolCall, ToolCalls, UpstreamServer

    double = ScriptedUpstream(max_model_len=1 << 20)
    double.script.extend(ToolCalls([ToolCall("computer", {"action": "click", "x": 60, "y": 90 + 30 * (i % 12)})])
                         for shots in screens for i in range(len(shots)))
    upstream = UpstreamServer(double)
    work.mkdir(parents=True, exist_ok=True)
    store_url = f"sqlite:///{work / 'store.sqlite'}"
    proxy, server, url = _serve_proxy(upstream.start(), work / "home", store_url)
    tools = [{"type": "function", "function": {"name": "computer", "parameters": {
        "type": "object", "properties": {"action": {"type": "string"}, "x": {"type": "integer"},
                                         "y": {"type": "integer"}}}}}]
    naive = calls = 0
    t0 = time.perf_counter()
    try:
        for r, shots in enumerate(screens):
            token = httpx.post(f"{url}/admin/rollouts", json={"rollout_id": f"gui-{r}"}, timeout=30,
                               headers={"Authorization": f"Bearer {proxy.admin_token}"}).json()["token"]
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0)
            msgs = [{"role": "system", "content": "You operate a browser. Close every open ticket."}]
            for i, png in enumerate(shots):
                msgs.append({"role": "user", "content": [{"type": "image_url", "image_url": {
                    "url": "data:image/png;base64," + base64.b64encode(png).decode()}}]})
                naive += sum(len(s) for s in shots[:i + 1])
                msg = client.chat.completions.create(model="m", messages=msgs, tools=tools).choices[0].message
                calls += 1
                msgs.append(msg.model_dump(exclude_none=True))
                msgs.append({"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "clicked"})
        proxy.store.flush(60)
        elapsed = time.perf_counter() - t0
    finally:
        server.stop()
        server.join(10)
        proxy.store.close()
        upstream.stop()
    engine = sa.create_engine(store_url)
    with engine.connect() as conn:
        n_blobs, stored = conn.execute(sa.text(
            "SELECT count(*), coalesce(sum(size), 0) FROM blobs WHERE media_type = 'image/png'")).one()
        listed = conn.execute(sa.text("SELECT image_hashes FROM calls")).scalars().all()
    engine.dispose()
    on_disk = sum(p.stat().st_size for p in (work / "home").rglob("*") if p.is_file())
    on_disk += sum(p.stat().st_size for p in work.glob("store.sqlite*"))
    distinct = {hashlib.sha256(s).hexdigest() for shots in screens for s in shots}
    return {"calls": calls, "screenshots": sum(map(len, screens)), "distinct_screenshots": len(distinct),
            "screenshot_blobs_stored": n_blobs, "screenshot_bytes_stored": stored,
            "screenshot_bytes_every_prompt_in_full": naive, "storage_ratio": round(stored / naive, 4),
            "screenshot_refs_listed_by_calls": sum(len(json.loads(x) if isinstance(x, str) else x or [])
                                                   for x in listed),
            "store_bytes_on_disk_total": on_disk, "calls_per_s_through_proxy": round(calls / elapsed, 2)}


def hashing_and_writes(shots: list[bytes], work: Path, n_writes: int) -> dict:
    from forge_store import Settings, open_store

    total = sum(map(len, shots))
    rounds = max(1, (64 << 20) // max(total, 1))
    t0 = time.perf_counter()
    for _ in range(rounds):
        for s in shots:
            hashlib.sha256(s).digest()
    dt = time.perf_counter() - t0
    hashing = {"hash_screenshots_per_s": round(rounds * len(shots) / dt, 1),
               "hash_mb_per_s": round(rounds * total / dt / 1e6, 1)}
    out = dict(hashing)
    for label, journal in (("", True), ("_no_journal", False)):
        # journal=True is how the proxy opens its store (the index row rides the journal); without it every
        # put_blob commits its own index row. The bytes are fsync'd before put_blob returns either way.
        home = work / f"blob-home{label}"
        store = open_store(f"sqlite:///{work / f'blobs{label}.sqlite'}", settings=Settings(home=home),
                           **({"journal": True, "name": "bench"} if journal else {}))
        try:
            blobs = [shots[i % len(shots)] + i.to_bytes(4, "big") for i in range(n_writes)]  # distinct, same size
            t0 = time.perf_counter()
            for b in blobs:
                store.put_blob(b, "image/png")
            store.flush(60)
            dt = time.perf_counter() - t0
        finally:
            store.close()
        out[f"blob_writes_per_s{label}"] = round(n_writes / dt, 1)
        out[f"blob_write_mb_per_s{label}"] = round(sum(map(len, blobs)) / dt / 1e6, 2)
    return {**out, "blob_writes": n_writes}


def sandbox_start(n: int) -> dict:
    from rollout import SandboxSpec
    from rollout._backends.local import LocalBackend

    root = Path(tempfile.mkdtemp(prefix="openforge-gui-bench-", dir="/tmp"))
    os.chmod(root, 0o755)
    env = root / "env"
    env.mkdir(mode=0o755)
    (env / "page.html").write_text(PAGE.replace("</script>", "step(3);</script>"))
    os.chmod(env / "page.html", 0o644)
    backend = LocalBackend(root / "sandboxes")
    creates, firsts, sizes = [], [], []
    try:
        for i in range(n):
            spec = SandboxSpec(rollout_id=f"gui-bench-{i}", run_id="bench", group_id="bench", task_id="bench",
                               workspace_seed=None, environment_dir=env, phases=())
            t0 = time.perf_counter()
            sb = backend.create(spec)
            t1 = time.perf_counter()
            try:
                r = backend.exec(sb, [CHROMIUM_BIN, "--headless", "--no-sandbox", "--disable-gpu",
                                      "--disable-dev-shm-usage", "--no-first-run", "--user-data-dir=/tmp/profile",
                                      "--window-size=800,600", "--screenshot=/tmp/shot.png",
                                      "file:///environment/page.html"], timeout_s=120,
                                 env={"HOME": "/tmp", "XDG_CONFIG_HOME": "/tmp", "XDG_CACHE_HOME": "/tmp"})
                t2 = time.perf_counter()
                shot = backend.get_file(sb, "/tmp/shot.png") if r.exit_code == 0 else b""
            finally:
                backend.destroy(sb)
            if not shot.startswith(b"\x89PNG"):
                raise RuntimeError(f"Chromium in the sandbox wrote no screenshot (exit {r.exit_code}): "
                                   f"{r.stderr[-1500:].decode(errors='replace')}")
            creates.append((t1 - t0) * 1000)
            firsts.append((t2 - t1) * 1000)
            sizes.append(len(shot))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"how": "LocalBackend (bubblewrap) create, then chromium --headless --screenshot inside it (plain "
                   "bwrap + chromium, no Playwright)",
            "sandboxes": n, "sandbox_create_ms_p50": round(statistics.median(creates), 1),
            "browser_first_screenshot_ms_p50": round(statistics.median(firsts), 1),
            "sandbox_with_browser_ms_p50": round(statistics.median(c + f for c, f in zip(creates, firsts)), 1),
            "sandbox_create_ms": [round(x, 1) for x in creates],
            "browser_first_screenshot_ms": [round(x, 1) for x in firsts], "screenshot_bytes": sizes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rollouts", type=int, default=3)
    ap.add_argument("--sandboxes", type=int, default=3)
    ap.add_argument("--blob-writes", type=int, default=300)
    args = ap.parse_args()
    if not Path(CHROMIUM).exists():
        sys.exit(f"{CHROMIUM} is missing: `make chromium` (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory(prefix="openforge-gui-storage-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        screens = [capture_screens(args.steps, work, seed) for seed in range(args.rollouts)]
        capture_s = time.perf_counter() - t0
        flat = [s for shots in screens for s in shots]
        out = {"steps": args.steps, "rollouts": args.rollouts,
               "screenshot_bytes_mean": round(statistics.mean(map(len, flat))),
               "capture_ms_per_screenshot": round(capture_s * 1000 / len(flat), 1)}
        out |= record_rollouts(screens, work / "rec")
        out["storage_ratio_target"] = 0.1
        out["storage_ratio_met"] = out["storage_ratio"] <= 0.1
        out |= hashing_and_writes(flat, work, args.blob_writes)
    out["sandbox_start"] = sandbox_start(args.sandboxes)
    out["cpus"] = os.cpu_count()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
