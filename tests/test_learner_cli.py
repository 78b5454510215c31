"""``openforge export`` and ``openforge export verify`` through the real CLI (typer runner, real SQLite)."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from forge_store import open_store
from learner._cli import export_app
from tests.test_learner_export import _seed

app = typer.Typer()
app.add_typer(export_app, name="export")


def test_export_and_verify_cli(tmp_path, settings):
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    with open_store(url, settings=settings) as st:
        _seed(st)
    r = CliRunner().invoke(app, ["export", "--format", "trl", "--where", "attempt = 1", "--store", url,
                                 "--out", str(tmp_path / "x")])
    assert r.exit_code == 0, r.output
    assert "merge rate 0.5" in r.output
    r = CliRunner().invoke(app, ["export", "verify", str(tmp_path / "x" / "manifest.json"), "--store", url])
    assert r.exit_code == 0 and "verified" in r.output
    r = CliRunner().invoke(app, ["export", "--where", "outcome = success", "--store", url, "--out", str(tmp_path / "y")])
    assert r.exit_code == 2 and "Example: outcome = 'success'" in r.output
    r = CliRunner().invoke(app, ["export", "--store", url, "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "not empty" in r.output


def test_export_workers_cli(tmp_path, settings):
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    with open_store(url, settings=settings) as st:
        _seed(st)
    r = CliRunner().invoke(app, ["export", "--workers", "0", "--store", url, "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--workers 0: an export needs at least one process" in r.output
    assert not (tmp_path / "x").exists()
    with open_store(url, settings=settings) as st:
        wm = str(st.watermark())
    for n in ("1", "2"):  # the same export (the same watermark) with one process and with workers
        r = CliRunner().invoke(app, ["export", "--format", "trl", "--workers", n, "--as-of", wm, "--store", url,
                                     "--out", str(tmp_path / n)])
        assert r.exit_code == 0, r.output
    assert (tmp_path / "1" / "manifest.json").read_bytes() == (tmp_path / "2" / "manifest.json").read_bytes()
