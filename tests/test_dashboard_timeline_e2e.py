"""End to end (issue 33): ``openforge dashboard`` serves the Timeline and Search pages; Playwright drives Debian's
Chromium (by path, never Playwright's own browser download) to deep links, checks what rendered and keeps a
screenshot of each page (paths printed; under the test's tmp dir):

- the timeline of a GUI rollout: the screenshot with the click drawn beside the action;
- the timeline of a 40-turn rollout opened at step 14: the segment boundary there and its reason (compaction);
- a search that finds a planted ``rm -rf`` command, with the link to its step;
- a GRPO group side by side (rewards, advantages, where the actions diverge);
- the token view of a segment: policy tokens coloured by logprob, environment tokens grey, ids in the hover.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from forge_store import Settings, open_store
from forge_store.testing import seed_demo_store
from tests.test_dashboard_e2e import CHROMIUM, serve_dashboard
from tests.test_dashboard_screenshots import record_gui_rollout
from tests.test_dashboard_timeline import PLANTED, record_long_rollout
from tests.test_dashboard_tokens import seed_token_group

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        import os

        msg = f"headless Chromium not found at {CHROMIUM}: apt-get install -y chromium"
        pytest.fail(msg + " (required in CI)") if os.environ.get("CI") else pytest.skip(msg)
    tmp = tmp_path_factory.mktemp("timeline-e2e")
    url, home = f"sqlite:///{tmp / 'store.sqlite'}", tmp / "home"
    with open_store(url, settings=Settings(home=home)) as st:
        seed_demo_store(st, n_tasks=2, per_task=3)
        record_long_rollout(st)
        record_gui_rollout(st)
        seed_token_group(st, tmp / "checkpoint")
        from learner import ExportConfig, export

        export(st, tmp / "export", ExportConfig(format="verl"), workers=1)
    with serve_dashboard(url, home, tmp / "dashboard.log") as base:
        yield base


@pytest.fixture(scope="module")
def browser(dashboard):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()


def _open(browser, url: str, wanted: tuple[str, ...], shot: Path, timeout: float = 90, height: int = 1600,
          inspect=None) -> str:
    """Load ``url``, wait until every ``wanted`` text shows and Streamlit has stopped running, screenshot the page
    (``inspect(page)`` runs on the settled page first)."""
    page = browser.new_page(viewport={"width": 1400, "height": height})  # Streamlit scrolls inside: a tall window
    try:
        page.goto(url, timeout=timeout * 1000)  # a loaded CI machine may take long to serve the first page
        text, settled, deadline = "", 0, time.monotonic() + timeout
        while time.monotonic() < deadline and settled < 3:
            text = page.inner_text("body")
            running = page.query_selector('[data-testid="stStatusWidget"]') is not None
            settled = settled + 1 if all(w in text for w in wanted) and not running else 0
            time.sleep(0.5)
        if inspect is not None:
            inspect(page)
        page.screenshot(path=str(shot), full_page=True)
    finally:
        page.close()
    print(f"page screenshot: {shot}")
    missing = [w for w in wanted if w not in text]
    assert not missing, f"the page lacks {missing}; screenshot: {shot}\n{text[:3000]}"
    assert "Traceback" not in text, f"screenshot: {shot}"
    assert shot.stat().st_size > 10_000, f"screenshot looks empty: {shot}"
    return text


def test_timeline_of_a_gui_rollout(dashboard, browser, tmp_path):
    _open(browser, f"{dashboard}/?page=Timeline&rollout=gui-r1&step=1",
          ("Rollout gui-r1", "Screen and action", "click(52, 95)", "Step 1 · computer"), tmp_path / "timeline-gui.png",
          height=3000)


def test_timeline_of_a_40_turn_rollout(dashboard, browser, tmp_path):
    text = _open(browser, f"{dashboard}/?page=Timeline&rollout=r-long&step=14",
                 ("Rollout r-long", "Segment 2 starts at step 14", "compaction: the history shrank",
                  "Step 14 · read_file", "Steps 9-28 of 40"), tmp_path / "timeline-40-turns.png", height=3600)
    assert "Step 29" not in text  # a window of steps, not all 40 at once


def test_search_finds_a_planted_command(dashboard, browser, tmp_path):
    _open(browser, f"{dashboard}/?page=Search&q=rm%20-rf%20/var",
          ("Calls holding 'rm -rf /var': 1 in 1 rollout,", "First hit: rollout r-long step 7", PLANTED[:6]),
          tmp_path / "search.png")


def test_group_view(dashboard, browser, tmp_path):
    _open(browser, f"{dashboard}/?page=Group&group=g-0-policy-v1",
          ("Group g-0-policy-v1", "3 rollouts", "Actions side by side"), tmp_path / "group.png")


def test_token_view_of_a_segment(dashboard, browser, tmp_path):
    seen = {}

    def inspect(page):
        seen["policy"], seen["env"] = page.locator("span.t.p[title]").count(), page.locator("span.t.e[title]").count()
        seen["title"] = page.locator("span.t.p[title]").first.get_attribute("title")  # the legend's have none
        seen["colours"] = page.evaluate(  # the tokens' own (the legend's spans have no title)
            "() => [...document.querySelectorAll('span.t[title]')].map(s => getComputedStyle(s).backgroundColor)")
        seen["n"] = page.locator("span.t[title]").count()
        low = page.locator('span.t.p[title*="logprob -6.0000"]').first
        low.scroll_into_view_if_needed()
        seen["low_box"] = low.bounding_box()

    _open(browser, f"{dashboard}/?page=Tokens&rollout=r-tok&segment=1",
          ("Rollout r-tok · segment 1 of 1", "policy tokens (mask 1)", "environment tokens (mask 0",
           "Lowest-probability policy tokens", "+0.707"), tmp_path / "tokens.png", height=2000, inspect=inspect)
    seen["colours"] = sorted(set(seen["colours"]))
    print(f"token view: {seen}")
    assert seen["policy"] > 20 and seen["env"] > 50  # every token a span, both kinds drawn
    assert seen["title"].startswith("#") and " id " in seen["title"] and "logprob" in seen["title"]
    assert len(seen["colours"]) >= 3  # grey environment tokens, and policy tokens in more than one colour
    assert seen["low_box"] and seen["low_box"]["width"] > 0  # the planted unlikely token is drawn
