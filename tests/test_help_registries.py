"""Help texts that list a registry are built from it: a harness, backend, exporter or dialect added to its registry
shows in the help of every option that takes one (issue 32: `openforge run --help` listed 5 of 8 harnesses)."""

from __future__ import annotations

import pytest
import typer

from learner import EXPORTERS
from openforge.cli import build_app
from rollout import backend_names, harness_names


def _dialects() -> list[str]:
    from proxy._protocols.openai_chat import DIALECTS   # the proxy's own registry of upstream dialects

    return list(DIALECTS)


def _option_help(path: list[str], flag: str) -> str:
    cmd = typer.main.get_command(build_app())
    for name in path:
        assert name in getattr(cmd, "commands", {}), f"openforge has no command {' '.join(path)}"
        cmd = cmd.commands[name]
    opt = next((p for p in cmd.params if flag in getattr(p, "opts", ())), None)
    assert opt is not None, f"openforge {' '.join(path)} has no {flag}"
    return opt.help or ""


@pytest.mark.parametrize("path, flag, names", [
    (["run"], "--harness", harness_names),
    (["run"], "--backend", backend_names),
    (["demo"], "--harness", harness_names),
    (["export"], "--format", lambda: list(EXPORTERS)),
    (["proxy"], "--dialect", _dialects),
])
def test_every_registered_name_is_in_the_help(path, flag, names):
    text = _option_help(path, flag)
    missing = [n for n in names() if n not in text]
    assert not missing, f"openforge {' '.join(path)} {flag}'s help misses {missing}: {text!r}"
