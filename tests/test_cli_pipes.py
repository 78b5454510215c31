"""Every command that prints a table, piped at 80 columns (issue 33): no header cell is cut, no line is wider than
the console, and every listing command has ``--json`` whose keys are the table's headers.

CliRunner's stdout is not a terminal, which is the pipe case (rich lays out at ``COLUMNS``, 80 here). The headers
to look for come from the same command's ``--json``, so the check knows nothing of the layout: a header is intact
when some output line holds it whole (in a table's header row, or as a record block's key).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from forge_store import Settings, open_store, print_table
from forge_store.testing import seed_demo_store
from openforge.cli import build_app

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 80
app = build_app()
runner = CliRunner()


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    home = tmp_path_factory.mktemp("pipes")
    url = f"sqlite:///{home / 'store.sqlite'}"
    with open_store(url, settings=Settings(home=home / "home")) as st:
        seed_demo_store(st, n_tasks=2, per_task=4)
    return url


@pytest.fixture(autouse=True)
def eighty_columns(monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    monkeypatch.setenv("OPENFORGE_HOME", str(tmp_path / "home"))


def _run(args: list[str]) -> str:
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return res.output


def assert_readable(text: str, headers: set[str]) -> None:
    lines = text.splitlines()
    too_wide = [line for line in lines if len(line) > WIDTH]
    assert not too_wide, f"lines wider than {WIDTH}: {too_wide[:3]}"
    cut = sorted(h for h in headers if not any(h in line for line in lines))
    assert not cut, f"header cells cut (not whole on any line): {cut}\n{text}"


def _keys(rows: list[dict]) -> set[str]:
    return {k for r in rows for k in r}


def test_store_info(seeded):
    assert_readable(_run(["store", "info", "--store", seeded]), {"table", "rows"})
    doc = json.loads(_run(["store", "info", "--store", seeded, "--json"]))
    assert doc["rows"]["rollouts"] == 16


def test_sql_with_many_columns(seeded):
    query = "SELECT * FROM rollouts ORDER BY id"
    rows = json.loads(_run(["sql", query, "--store", seeded, "--json"]))
    assert len(rows) == 16 and len(rows[0]) > 8  # far wider than 80 columns: one record per block
    assert_readable(_run(["sql", query, "--store", seeded]), _keys(rows))
    narrow = "SELECT tool_name, count(*) AS n FROM tool_calls GROUP BY 1 ORDER BY 1"
    out = _run(["sql", narrow, "--store", seeded])
    assert "┃ tool_name" in out or "│ tool_name" in out  # narrow enough: still a table


def test_analyze(seeded):
    report = json.loads(_run(["analyze", "--store", seeded, "--json"]))
    assert {"summary", "behaviour", "categories", "exclusions"} <= set(report)
    headers = set().union(*(_keys(rows) for rows in report.values()))
    assert_readable(_run(["analyze", "--store", seeded]), headers)


def test_analyze_compare(seeded):
    args = ["analyze", "--store", seeded, "--compare", "policy-v1", "policy-v2", "--purpose", "any"]
    doc = json.loads(_run([*args, "--json"]))
    assert doc["rubrics"]
    assert_readable(_run(args), {"rubric", "B - A", "95% CI", "excludes 0", "tasks", "McNemar p"})


def test_lineage(seeded):
    chain = json.loads(_run(["lineage", "policy-v2", "--store", seeded, "--json"]))
    assert chain[-1]["policy_version"] == "policy-v2"
    assert_readable(_run(["lineage", "policy-v2", "--store", seeded]),
                    {"#", "policy version", "algorithm", "parent", "export", "shard", "watermark", "samples",
                     "steps", "loss"})


def test_tasks_list_and_families():
    folder = ROOT / "examples" / "tasks"
    rows = json.loads(_run(["tasks", "list", str(folder), "--json"]))
    assert rows
    assert_readable(_run(["tasks", "list", str(folder)]), {"task", "version", "domain", "files", "solution", "origin"})
    families = json.loads(_run(["tasks", "families", "--json"]))
    assert families and all(isinstance(v, list) for v in families.values())


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=WIDTH), buf


def test_run_summary_and_scoreboard():
    """The two tables printed at the end of long commands (``openforge run``, ``openforge demo``)."""
    from collections import Counter
    from types import SimpleNamespace

    from openforge.run import _print_summary
    from openforge.scoreboard import Rate, VersionRow, print_scoreboard

    summary = SimpleNamespace(run_id="run-2026-12-02-abcdef", results=[1] * 24, groups=6, groups_complete=6,
                              superseded_groups=0, mean_reward=0.5, cancelled=False, wall_s=12.3,
                              outcomes=Counter(success=12, failure=8, policy_timeout=2, infra_error=2))
    out, buf = _console()
    _print_summary(summary, out, json_out=False)
    assert_readable(buf.getvalue(), {"rollouts", "groups complete", "success", "failure", "policy_timeout",
                                     "infra_error", "mean reward", "wall s"})
    out, buf = _console()
    row = VersionRow(version="grpo-round-3-0123456789abcdef", parent="grpo-round-2-0123456789abcdef",
                     made_by="grpo", heldout=Rate(20, 48), train=Rate(60, 96), calls=12345, samples=4321,
                     seconds=100.0)
    print_scoreboard(out, [row], {"rollouts": 10.0, "train": 20.0})
    assert_readable(buf.getvalue(), {"version", "made by", "parent", "held-out success", "train success", "calls",
                                     "samples", "phase", "seconds"})


def test_a_table_that_fits_stays_a_table_and_cells_fold():
    out, buf = _console()
    print_table(out, "t", [{"id": "x" * 200, "n": 1}])
    text = buf.getvalue()
    assert "┃ id" in text or "│ id" in text
    assert all(len(line) <= WIDTH for line in text.splitlines())
    assert text.count("x") == 200  # folded, never cut


def test_markup_in_cells_prints_as_written():
    out, buf = _console()
    print_table(out, "metrics [v2]", [{"success[check]": "[bold]x[/]", "n": 1.5}])
    text = buf.getvalue()
    assert "success[check]" in text and "[bold]x[/]" in text and "1.500" in text and "metrics [v2]" in text


def test_search(seeded):
    """``openforge search`` (its entry point reaches the venv on reinstall: driven through its own typer app)."""
    import typer

    from forge_store._search_cli import search_command

    search_app = typer.Typer()
    search_app.command("search")(search_command)
    search_app.command("noop")(lambda: None)
    res = runner.invoke(search_app, ["search", "pytest -q", "--store", seeded, "--json"])
    assert res.exit_code == 0, res.output
    hits = json.loads(res.output)["hits"]
    assert hits
    res = runner.invoke(search_app, ["search", "pytest -q", "--store", seeded])
    assert res.exit_code == 0, res.output
    assert_readable(res.output, {"rollout", "step", "call", "task", "version", "outcome", "snippet"})
