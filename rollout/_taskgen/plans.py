"""The ``plan`` family: three or four steps that build on each other, rewarded only when *every* step is done.

One file travels through the plan: it is copied or moved into a new folder, renamed, gets a line appended or a word
replaced, and its line count is written down, each step naming the path it acts on (the path the previous step
left). Order matters (a count taken before the append is wrong) and nothing is partial: the whole end state is one
check, so the reward is 1 or 0 (``files`` gives a share per step). The reference solution is one tool call per
step, in order.
"""

from __future__ import annotations

import posixpath

from ._model import Draft, Draw, Step, absent, number, text, unchanged
from .files import ANSWER, EXTS, FOLDERS, WORDS, _bash, _body, _q

NAME = "plan"
__all__ = ["ANSWER", "DIFFICULTIES", "MAX_STEPS", "NAME", "TEMPLATES", "draft"]
INTROS = ("Do these steps in order; the task counts only when every step is done:",
          "Complete every step below, in order (all of them are needed):",
          "Follow this plan step by step; only the whole plan counts:")


class _Plan:
    """The traveling file's path and lines, and the end-state conditions collected so far."""

    def __init__(self, d: Draw):
        self.d = d
        self.path = d.file()
        self.lines = d.lines(2, 4)
        self.start = (self.path, _body(self.lines))
        self.kept: dict[str, str] = {}      # path -> content that must still be there at the end
        self.gone: set[str] = set()         # paths that must not exist at the end
        self.numbers: dict[str, int] = {}   # path -> the number it must hold


def to_folder(p: _Plan) -> tuple[str, str]:
    folder = p.d.folder()
    verb, tool = ("copy", "cp") if p.d.rng.random() < 0.5 else ("move", "mv")
    if verb == "copy":
        p.kept[p.path] = _body(p.lines)
    else:
        p.gone.add(p.path)
    say = f"Make a folder {folder} and {verb} {p.path} into it."
    cmd = f"mkdir -p {_q(folder)} && {tool} {_q(p.path)} {_q(folder)}/"
    p.path = f"{folder}/{posixpath.basename(p.path)}"
    return say, cmd


def rename(p: _Plan) -> tuple[str, str]:
    new = posixpath.join(posixpath.dirname(p.path), p.d.file())
    say, cmd = f"Rename {p.path} to {new}.", f"mv {_q(p.path)} {_q(new)}"
    p.gone.add(p.path)
    p.path = new
    return say, cmd


def append(p: _Plan) -> tuple[str, str]:
    line = p.d.line()
    p.lines.append(line)
    return f"Append the line '{line}' to {p.path}.", f"echo {_q(line)} >> {_q(p.path)}"


def replace(p: _Plan) -> tuple[str, str]:
    words = sorted({w for x in p.lines for w in x.split()})
    alone = [w for w in words if not any(w != o and w in o for o in words)]   # no other word contains it
    old = p.d.rng.choice(alone)
    new = p.d.word(avoid=tuple(words))
    p.lines = [x.replace(old, new) for x in p.lines]
    return f"In {p.path}, replace every '{old}' with '{new}'.", f"sed -i 's/{old}/{new}/g' {_q(p.path)}"


def count(p: _Plan) -> tuple[str, str]:
    out = p.d.file()
    p.numbers[out] = len(p.lines)
    return f"Write the number of lines of {p.path} to {out}.", f"wc -l < {_q(p.path)} > {_q(out)}"


TEMPLATES = {t.__name__: t for t in (to_folder, rename, append, replace, count)}
MAX_STEPS = 4
DIFFICULTIES = (3, 4)


def draft(seed: int, difficulty: int) -> Draft:
    """A plan of ``difficulty`` steps: into a folder first, a count last, the rest drawn; one check over the whole
    end state (``Draft.whole``), plus one or two guard files no step names."""
    if not 2 <= difficulty <= MAX_STEPS:
        raise ValueError(f"a plan has 2 to {MAX_STEPS} steps, not {difficulty}")
    d = Draw(seed, WORDS, FOLDERS, EXTS)
    p = _Plan(d)
    middle = d.rng.sample(["rename", "append", "replace"], difficulty - 2)
    names = ["to_folder", *middle, "count"]
    steps = []
    for i, name in enumerate(names):
        say, cmd = TEMPLATES[name](p)
        steps.append(Step(name, say, (name, say), actions=[_bash(cmd)], shell=[cmd], checks={},
                          files={p.start[0]: p.start[1]} if i == 0 else {}))
    conds = [text(p.path, _body(p.lines))]
    conds += [unchanged(path, body) for path, body in sorted(p.kept.items())]
    conds += [absent(path) for path in sorted(p.gone)]
    conds += [number(path, n) for path, n in sorted(p.numbers.items())]
    distractors = {d.file(): _body(d.lines(1, 3)) for _ in range(d.rng.randint(1, 2))}
    return Draft(steps, d.pick(INTROS), distractors, whole={"every_step": conds})
