"""Browser render time of a 1,000-call rollout's Timeline page (issue 33's target: it opens in under 2 s).

Records one rollout of ``--calls`` calls through ``Store.record_call`` into a SQLite store (the real write path), serves
``openforge dashboard`` on it and opens ``?page=Timeline&rollout=long-1000&step=1`` in Debian's Chromium driven by
Playwright (never Playwright's own browser download), each time in a fresh page. An open counts from ``goto`` until
the page holds the window's last step, the step index and the timing chart and Streamlit's script has stopped
running. The first open is reported apart (the server's first run imports pandas and altair); each of the others
(``open_s``) is a page in a new browser context, whose cache is empty: the browser fetches and compiles Streamlit's
JavaScript again, as on a first visit. ``warm_open_s``: the same link opened again and again in one context, after
one open there, as a user's browser that has shown the dashboard before opens a link (its HTTP cache and compiled
scripts kept). Also timed: opening the linked step 500
(a window in the middle) and the Tokens page of the same rollout's first segment. The last line printed is one JSON
object:

    python bench/timeline_render.py [--calls 1000] [--repeat 5] [--url sqlite:///store.sqlite]

``{"calls": 1000, "first_open_s": ..., "open_s": <median>, "opens_s": [...], "warm_open_s": ..., "browser_task_s": ...,
"browser_script_s": ..., "browser_cpu_s": ..., "server_cpu_s": ..., "load_average": [...], "step_500_open_s": ...,
"tokens_open_s": ...}``: ``browser_task_s`` and ``browser_script_s`` are the medians of Chromium's main-thread task
and JavaScript time during an open (from the DevTools ``Performance`` domain), which say how much of the open is the
browser's drawing; ``browser_cpu_s`` and ``server_cpu_s`` the medians of the CPU seconds Chromium's processes (all of
them) and the dashboard's server spent during an open. Wall-clock figures, main-thread task time included, on a
loaded machine measure the neighbours too (the load average is printed): run it on a quiet one, or compare the CPU
seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forge_store import Settings, open_store  # noqa: E402
from forge_store.testing import T0, Turn, agent_calls  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
RID = "long-1000"


def record(url: str, home: Path, n: int) -> None:
    turns = [Turn([("bash", {"command": f"make step{i}"})], [f"step {i}: " + "output " * 40]) for i in range(n)]
    with open_store(url, settings=Settings(home=home)) as st:
        st.start_rollout(RID, task_id="task-0", policy_version_id="pv-bench", started_at=T0)
        for rec in agent_calls(RID, turns, started_at=T0, policy_version_id="pv-bench"):
            st.record_call(rec)
        st.finish_rollout(RID, "success", ended_at=T0 + timedelta(hours=1))
        st.add_reward(RID, 1.0, verifier_version="v1")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(url: str, home: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = _port()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "openforge", "dashboard", "--store", url, "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "OPENFORGE_HOME": str(home)})
    base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the dashboard exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2):
                return proc, base
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the dashboard did not answer within 120 s:\n{log.read_text()}")


READY = """(wanted) => {
    const text = document.body ? document.body.innerText : "";
    if (document.querySelector('[data-testid="stStatusWidget"]')) return false;
    return wanted.every(w => text.includes(w)) && !!document.querySelector('[data-testid="stVegaLiteChart"], '
        + '[data-testid="stArrowVegaLiteChart"]') === WANT_CHART;
}"""


def cpu_s(server: int) -> dict[str, float]:
    """CPU seconds (user + system, every thread) spent so far by this process's Chromium processes and by the
    dashboard (``server`` and its children: Streamlit runs in one): unlike wall-clock and main-thread task time, they
    barely grow when neighbours load the machine. Reads Linux's /proc."""
    tick, procs, children = os.sysconf("SC_CLK_TCK"), {}, {}
    for d in Path("/proc").iterdir():
        try:
            stat = (d / "stat").read_text() if d.name.isdigit() else ""
        except OSError:  # it exited meanwhile
            continue
        if stat:
            comm, f = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            procs[int(d.name)] = (comm, (int(f[11]) + int(f[12])) / tick)
            children.setdefault(int(f[1]), []).append(int(d.name))

    def tree(pid: int) -> list[int]:
        out, todo = [], [pid]
        while todo:
            out.append(todo.pop())
            todo.extend(children.get(out[-1], []))
        return out

    dashboard = set(tree(server)) if server in procs else set()
    browser = sum(procs[p][1] for p in tree(os.getpid()) if p not in dashboard and procs.get(p, ("",))[0] == "chromium")
    return {"browser": browser, "server": sum(procs[p][1] for p in dashboard)}


VIEWPORT = {"width": 1400, "height": 1600}


def open_s(browser, url: str, wanted: list[str], chart: bool = True, timeout: float = 120,
           metrics: list | None = None, server: int = 0, context=None) -> float:
    """Seconds from navigation until every ``wanted`` text (and the chart) shows and the script has stopped, in a
    new page of ``context`` (default: of a new context, whose HTTP cache is empty); with ``metrics``, appends
    Chromium's main-thread figures for the open (``Performance.getMetrics``: TaskDuration, ScriptDuration,
    LayoutDuration, in seconds) and the CPU seconds the browser and the ``server`` process spent."""
    page = context.new_page() if context is not None else browser.new_page(viewport=VIEWPORT)
    try:
        cdp = page.context.new_cdp_session(page)
        cdp.send("Performance.enable")
        cpu0 = cpu_s(server)
        t = time.perf_counter()
        page.goto(url, timeout=timeout * 1000)
        page.wait_for_function(READY.replace("WANT_CHART", "true" if chart else "false"), arg=wanted,
                               polling=25, timeout=timeout * 1000)
        took = time.perf_counter() - t
        # a second look a moment later: the script must not have started again (it would have been a partial page)
        time.sleep(0.3)
        if page.query_selector('[data-testid="stStatusWidget"]') is not None:
            page.wait_for_function(READY.replace("WANT_CHART", "true" if chart else "false"), arg=wanted,
                                   polling=25, timeout=timeout * 1000)
            took = time.perf_counter() - t
        if metrics is not None:
            m = {x["name"]: x["value"] for x in cdp.send("Performance.getMetrics")["metrics"]}
            metrics.append({k: round(m.get(k, 0.0), 2) for k in ("TaskDuration", "ScriptDuration", "LayoutDuration")})
            cpu1 = cpu_s(server)
            metrics[-1].update({f"{k}_cpu": round(cpu1[k] - cpu0[k], 2) for k in cpu1})
        return took
    finally:
        page.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--url", help="A store that already holds rollout long-1000 (an earlier run's --keep).")
    ap.add_argument("--keep", action="store_true", help="Keep the store (its URL is printed).")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    tmp = Path(tempfile.mkdtemp(prefix="of_bench_timeline_"))
    home, url = tmp / "home", args.url or f"sqlite:///{tmp / 'store.sqlite'}"
    if not args.url:
        t = time.perf_counter()
        record(url, home, args.calls)
        print(f"recorded {args.calls} calls in {time.perf_counter() - t:.1f}s ({url})", file=sys.stderr)
    proc, base = serve(url, home, tmp / "dashboard.log")
    n = args.calls
    last = min(20, n)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
            link = f"{base}/?page=Timeline&rollout={RID}&step=1"
            wanted = [f"Steps 1-{last} of {n}", f"Step {last} · bash", f"Step index ({n} steps)"]
            first = open_s(browser, link, wanted)
            metrics: list[dict] = []
            opens = [open_s(browser, link, wanted, metrics=metrics, server=proc.pid) for _ in range(args.repeat)]
            warm_ctx = browser.new_context(viewport=VIEWPORT)   # one profile: the browser's cache kept between opens
            open_s(browser, link, wanted, context=warm_ctx)
            warm = [open_s(browser, link, wanted, context=warm_ctx) for _ in range(args.repeat)]
            warm_ctx.close()
            lo = max(1, min(500 - 5, n - 19))
            mid = open_s(browser, f"{base}/?page=Timeline&rollout={RID}&step=500",
                         [f"Steps {lo}-{lo + 19} of {n}", "Step 500 · bash"]) if n >= 500 else None
            tokens = open_s(browser, f"{base}/?page=Tokens&rollout={RID}&segment=1",
                            ["Lowest-probability policy tokens", f"Rollout {RID} · segment 1"], chart=False)
            browser.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
        if not args.keep and not args.url:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"calls": n, "first_open_s": round(first, 2), "open_s": round(statistics.median(opens), 2),
                      "opens_s": [round(x, 2) for x in opens],
                      "warm_open_s": round(statistics.median(warm), 2), "warm_opens_s": [round(x, 2) for x in warm],
                      "browser_task_s": statistics.median(m["TaskDuration"] for m in metrics),
                      "browser_script_s": statistics.median(m["ScriptDuration"] for m in metrics),
                      "browser_cpu_s": statistics.median(m["browser_cpu"] for m in metrics),
                      "server_cpu_s": statistics.median(m["server_cpu"] for m in metrics),
                      "load_average": [round(x, 1) for x in os.getloadavg()],
                      "step_500_open_s": None if mid is None else round(mid, 2), "tokens_open_s": round(tokens, 2),
                      **({"url": url} if args.keep else {})}))


if __name__ == "__main__":
    main()
