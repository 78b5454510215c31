"""The ``openforge`` command: a root that imports no part. Each part declares its commands as entry points.

A part lists its commands in ``pyproject.toml`` under ``[project.entry-points."openforge.commands"]``, one entry a
command: the entry's name is the command's name, its object a Typer app (a group) or a function (a command), and
its extras the optional dependencies the command needs (``proxy = "proxy._cli:proxy_command [proxy]"``). The root
loads them when it starts, the way pytest and datasette load their plugins. A command whose extras are not
installed is still listed, and running it says which extra to install; nothing else of that part is imported.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import re
import sys

import typer

GROUP = "openforge.commands"
DIST = "openforge"
HELP = "OpenForge: record agent rollouts token-exactly and turn them into RL training data."


@functools.cache
def _installed() -> frozenset[str]:
    """Normalised names of every installed distribution (one pass over the path)."""
    return frozenset(_norm(d.metadata["Name"] or "") for d in md.distributions())


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def _extra_requirements() -> dict[str, list[str]]:
    """Extra name -> the distribution names it requires (``openforge[x]`` entries expanded)."""
    from packaging.requirements import Requirement

    out: dict[str, list[str]] = {}
    for spec in md.requires(DIST) or []:
        req = Requirement(spec)
        if req.marker is None:
            continue
        for extra in _extras_of_marker(str(req.marker)):
            if _norm(req.name) == DIST:
                out.setdefault(extra, []).extend(f"{DIST}[{e}]" for e in sorted(req.extras))
            else:
                out.setdefault(extra, []).append(req.name)
    return out


def _extras_of_marker(marker: str) -> list[str]:
    return re.findall(r"extra\s*==\s*['\"]([\w.-]+)['\"]", marker)


def missing_requirements(extras: list[str] | tuple[str, ...]) -> list[str]:
    """The requirements of ``extras`` (of the installed openforge) that are not installed; [] when all are."""
    table, installed = _extra_requirements(), _installed()
    missing, seen = [], set()

    def walk(extra: str) -> None:
        if extra in seen:
            return
        seen.add(extra)
        for name in table.get(extra, ()):
            nested = re.fullmatch(rf"{DIST}\[([\w.-]+)\]", name)
            if nested:
                walk(nested.group(1))
            elif _norm(name) not in installed:
                missing.append(name)

    for extra in extras:
        walk(extra)
    return missing


def _add_unavailable(app: typer.Typer, name: str, extras: list[str], why: str) -> None:
    """``openforge NAME ...`` (any arguments) fails with what is missing and the command that installs it."""
    install = f"pip install 'openforge[{','.join(extras)}]'" if extras else "reinstall openforge"

    def command(ctx: typer.Context) -> None:
        typer.echo(f"error: `openforge {name}` is not available here: {why}. Install it with: {install}", err=True)
        raise typer.Exit(2)

    app.command(name, help=f"(not installed: {install})", add_help_option=False,
                context_settings={"ignore_unknown_options": True, "allow_extra_args": True})(command)


def build_app() -> typer.Typer:
    app = typer.Typer(help=HELP, no_args_is_help=True, pretty_exceptions_enable=False)
    for ep in sorted(md.entry_points(group=GROUP), key=lambda e: e.name):
        extras = list(ep.extras)
        missing = missing_requirements(extras)
        if missing:
            _add_unavailable(app, ep.name, extras, f"it needs {', '.join(missing)}")
            continue
        try:
            obj = ep.load()
        except Exception as exc:  # one broken part must not take the other parts' commands down with it
            _add_unavailable(app, ep.name, extras, f"loading {ep.value} failed ({type(exc).__name__}: {exc})")
            continue
        if isinstance(obj, typer.Typer):
            app.add_typer(obj, name=ep.name)
        else:
            app.command(ep.name)(obj)
    return app


def main() -> None:  # pragma: no cover - console script entry
    build_app()(prog_name="openforge")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
