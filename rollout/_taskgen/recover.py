"""The ``recover`` family: steps whose natural command *fails with an informative error* on many instances, so that
tool errors are common and recovering from them pays.

- a destination folder that may not exist (``mv f d/`` -> "Not a directory", ``echo x > d/n`` -> "No such file or
  directory"): about half the instances; the fix is ``mkdir``;
- a file named without its folder ("it is in one of the folders here"): acting on the bare name always fails
  ("No such file or directory"); the fix is to look (``ls``, ``find``) and act on the path found.

The verifier scores the end state only (as in ``files``: the share of a step's checks that pass, the mean over
steps; guard files that must survive). The reference solution (what the scripted teacher plays) is *privileged*: it
knows whether the folder exists and where the file lives, so it never meets an error and never searches (one tool
call per step). Recovering is what a student has to find itself. The *careful* solution (``Step.careful``; a
generation's ``careful`` share of steps) knows nothing hidden: it runs the natural command and, when that fails,
recovers from the error (``mkdir -p`` and the command again; ``find . -name f`` and the command on the path found).
"""

from __future__ import annotations

from ._model import Draft, Draw, Step, absent, number, text, unchanged
from .files import ANSWER, _bash, _body, _q, draw_draft

NAME = "recover"
__all__ = ["ANSWER", "MAX_STEPS", "NAME", "TEMPLATES", "draft"]


def _folder(d: Draw) -> tuple[str, dict[str, str], bool]:
    """A destination folder that exists (holding a file that must stay) or not, about half the time each."""
    folder = d.folder()
    if d.rng.random() < 0.5:
        return folder, {}, False
    return folder, {f"{folder}/{d.file()}": _body(d.lines(1, 2))}, True


def _mkdir(folder: str, exists: bool, cmd: str) -> str:
    return cmd if exists else f"mkdir -p {_q(folder)} && {cmd}"


def _retry(folder: str, exists: bool, cmd: str) -> list[dict]:
    """The careful solution: the natural command; where the folder is missing it fails, then mkdir and again."""
    return [_bash(cmd)] if exists else [_bash(cmd), _bash(_mkdir(folder, False, cmd))]


def _kept(files: dict[str, str]) -> dict[str, list[dict]]:
    return {"folder_kept": [unchanged(p, b) for p, b in files.items()]} if files else {}


def into_folder(d: Draw) -> Step:
    f, (folder, held, exists) = d.file(), _folder(d)
    body = _body(d.lines(1, 3))
    say = d.pick(("Move {f} into the folder {d}.", "Put the file {f} into the folder {d}.",
                  "Move the file {f} into {d}/."))
    natural = f"mv {_q(f)} {_q(folder)}/"
    cmd = _mkdir(folder, exists, natural)
    return Step("into_folder", say.format(f=f, d=folder), ("into_folder", f, folder, exists), files={f: body, **held},
                actions=[_bash(cmd)], shell=[cmd],
                checks={"moved": [text(f"{folder}/{f}", body), absent(f)]}, guards=_kept(held),
                careful=_retry(folder, exists, natural))


def copy_into(d: Draw) -> Step:
    f, (folder, held, exists) = d.file(), _folder(d)
    body = _body(d.lines(1, 3))
    say = d.pick(("Copy {f} into the folder {d}.", "Put a copy of {f} in the folder {d}.",
                  "Copy the file {f} into {d}/."))
    natural = f"cp {_q(f)} {_q(folder)}/"
    cmd = _mkdir(folder, exists, natural)
    return Step("copy_into", say.format(f=f, d=folder), ("copy_into", f, folder, exists), files={f: body, **held},
                actions=[_bash(cmd)], shell=[cmd], checks={"copied": [text(f"{folder}/{f}", body)]},
                guards={"source_kept": [unchanged(f, body)], **_kept(held)}, careful=_retry(folder, exists, natural))


def save_into(d: Draw) -> Step:
    (folder, held, exists), name, line = _folder(d), d.file(), d.line()
    path = f"{folder}/{name}"
    say = d.pick(("Save the line '{l}' in the file {p}.", "Write the line '{l}' to {p}.",
                  "Create {p} containing the line '{l}'."))
    natural = f"echo {_q(line)} > {_q(path)}"
    cmd = _mkdir(folder, exists, natural)
    return Step("save_into", say.format(l=line, p=path), ("save_into", path, line, exists), files=held,
                actions=[_bash(cmd)], shell=[cmd], checks={"saved": [text(path, line + "\n")]}, guards=_kept(held),
                careful=_retry(folder, exists, natural))


def locate(d: Draw) -> Step:
    """An operation on a file named without its folder: it lies in one of two or three folders."""
    f = d.file()
    folders = [d.folder() for _ in range(d.rng.randint(2, 3))]
    home = d.rng.choice(folders)
    path = f"{home}/{f}"
    lines = d.lines(2, 5)
    body = _body(lines)
    others = {f"{x}/{d.file()}": _body(d.lines(1, 2)) for x in folders if x != home}
    op = d.pick(("delete", "count", "rename"))
    where = d.pick(("it is in one of the folders here", "it is somewhere in a folder under this one"))
    if op == "delete":
        cmd, bare, say = f"rm {_q(path)}", f"rm {_q(f)}", f"Delete the file {f} ({where})."
        checks = {"deleted": [absent(path)]}
    elif op == "count":
        out = d.file()
        cmd, say = f"wc -l < {_q(path)} > {_q(out)}", f"Write the number of lines of {f} ({where}) to {out}."
        bare = f"wc -l < {_q(f)} > {_q(out)}"
        checks = {"counted": [number(out, len(lines))]}
    else:
        new = d.file()
        cmd, say = f"mv {_q(path)} {_q(home)}/{_q(new)}", f"Rename the file {f} ({where}) to {new}, in its folder."
        bare = f"mv {_q(f)} {_q(new)}"
        checks = {"renamed": [text(f"{home}/{new}", body), absent(path)]}
    guards = {"others_kept": [unchanged(p, b) for p, b in others.items()]}
    if op != "delete" and op != "rename":
        guards["file_kept"] = [unchanged(path, body)]
    return Step("locate", say, ("locate", f, op, home), files={path: body, **others}, actions=[_bash(cmd)],
                shell=[cmd], checks=checks, guards=guards,
                careful=[_bash(bare), _bash(f"find . -name {_q(f)}"), _bash(cmd)])


TEMPLATES = {t.__name__: t for t in (into_folder, copy_into, save_into, locate)}
MAX_STEPS = 3


def draft(seed: int, difficulty: int) -> Draft:
    """``difficulty`` distinct templates, plus one or two guard files no step names."""
    return draw_draft(TEMPLATES, seed, difficulty)
