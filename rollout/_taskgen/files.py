"""The ``files`` family: short file and shell tasks (create, append, rename, copy, delete, count lines, replace a
word, make a folder and move a file into it), one to three steps per task.

Every step works on files of its own (names are never shared between the steps of one task), so a task's reward
is the mean of its steps' scores and a model that does two steps of three earns 2/3. Each template has a few
wordings (picked by seed) so that a policy cannot learn one sentence; the reference solution is one tool call per
step: ``write_file`` to create a file, ``bash`` for the rest.
"""

from __future__ import annotations

import shlex

from ._model import Draft, Draw, Step, absent, number, text, unchanged

NAME = "files"
WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "orange", "silver", "violet", "planet", "rocket",
         "garden", "window", "pencil", "coffee", "lemon", "forest", "ocean", "bridge", "candle", "castle", "desert",
         "falcon", "harbor", "island", "jungle", "meadow", "pepper", "rabbit", "saddle", "tunnel", "valley",
         "wizard", "yellow", "zebra", "copper", "dragon", "pillow", "basket", "button")
FOLDERS = ("archive", "backup", "docs", "old", "notes", "drafts", "logs", "reports", "misc", "data")
EXTS = ("txt", "txt", "txt", "md", "log")
INTROS = ("Do these steps in order:", "Complete the following steps:", "Please do the following:")
ANSWER = "Done."


def _bash(command: str) -> dict:
    return {"tool": "bash", "arguments": {"command": command}}


def _q(s: str) -> str:
    return shlex.quote(s)


def _body(lines: list[str]) -> str:
    return "".join(f"{x}\n" for x in lines)


def create(d: Draw) -> Step:
    f, c = d.file(), d.line()
    say = d.pick(("Create a file {f} containing the line '{c}'.", "Write the line '{c}' to a new file named {f}.",
                  "Make a new file {f} with this one line: '{c}'."))
    return Step("create", say.format(f=f, c=c), ("create", f, c),
                actions=[{"tool": "write_file", "arguments": {"path": f, "content": c + "\n"}}],
                shell=[f"printf '%s\\n' {_q(c)} > {_q(f)}"], checks={"created": [text(f, c + "\n")]})


def append(d: Draw) -> Step:
    f = d.file()
    body = _body(d.lines(1, 3))
    line = d.line()
    say = d.pick(("Append the line '{l}' to {f}.", "Add the line '{l}' at the end of the file {f}.",
                  "Add '{l}' as a new last line of {f}."))
    return Step("append", say.format(f=f, l=line), ("append", f, line), files={f: body},
                actions=[_bash(f"echo {_q(line)} >> {_q(f)}")], shell=[f"echo {_q(line)} >> {_q(f)}"],
                checks={"appended": [text(f, body + line + "\n")]})


def rename(d: Draw) -> Step:
    src, dst = d.file(), d.file()
    body = _body(d.lines(1, 3))
    say = d.pick(("Rename {a} to {b}.", "Rename the file {a} to {b}.", "Change the name of {a} to {b}."))
    cmd = f"mv {_q(src)} {_q(dst)}"
    return Step("rename", say.format(a=src, b=dst), ("rename", src, dst), files={src: body},
                actions=[_bash(cmd)], shell=[cmd],
                checks={"renamed": [text(dst, body)], "not_copied": [text(dst, body), absent(src)]})


def copy(d: Draw) -> Step:
    src, dst = d.file(), d.file()
    body = _body(d.lines(1, 3))
    say = d.pick(("Copy {a} to {b}.", "Make a copy of {a} named {b}.", "Duplicate the file {a} as {b}."))
    cmd = f"cp {_q(src)} {_q(dst)}"
    return Step("copy", say.format(a=src, b=dst), ("copy", src, dst), files={src: body},
                actions=[_bash(cmd)], shell=[cmd], checks={"copied": [text(dst, body)]},
                guards={"source_kept": [unchanged(src, body)]})


def delete(d: Draw) -> Step:
    f = d.file()
    say = d.pick(("Delete the file {f}.", "Remove {f}.", "Delete {f} from the folder."))
    cmd = f"rm {_q(f)}"
    return Step("delete", say.format(f=f), ("delete", f), files={f: _body(d.lines(1, 2))},
                actions=[_bash(cmd)], shell=[cmd], checks={"deleted": [absent(f)]})


def count(d: Draw) -> Step:
    src, dst = d.file(), d.file()
    lines = d.lines(2, 9)
    say = d.pick(("Count the lines in {a} and write the number to {b}.",
                  "Write the number of lines of {a} into a new file {b}.",
                  "Save the line count of {a} in {b} (just the number)."))
    cmd = f"wc -l < {_q(src)} > {_q(dst)}"
    return Step("count", say.format(a=src, b=dst), ("count", src, dst), files={src: _body(lines)},
                actions=[_bash(cmd)], shell=[cmd], checks={"counted": [number(dst, len(lines))]},
                guards={"source_kept": [unchanged(src, _body(lines))]})


def replace(d: Draw) -> Step:
    f = d.file()
    old = d.word()
    new = d.word(avoid=(old,))
    lines = d.lines(2, 4, avoid=(old, new))
    for i in d.rng.sample(range(len(lines)), d.rng.randint(1, min(2, len(lines)))):
        words = lines[i].split()
        words.insert(d.rng.randint(0, len(words)), old)
        lines[i] = " ".join(words)
    body = _body(lines)
    say = d.pick(("In {f}, replace every '{o}' with '{n}'.", "Replace the word '{o}' with '{n}' everywhere in {f}.",
                  "Change each '{o}' in {f} to '{n}'."))
    cmd = f"sed -i 's/{old}/{new}/g' {_q(f)}"
    return Step("replace", say.format(f=f, o=old, n=new), ("replace", f, old, new), files={f: body},
                actions=[_bash(cmd)], shell=[cmd], checks={"replaced": [text(f, body.replace(old, new))]})


def move_into(d: Draw) -> Step:
    f, folder = d.file(), d.folder()
    body = _body(d.lines(1, 3))
    say = d.pick(("Make a folder {d} and move {f} into it.", "Create a directory {d} and move the file {f} there.",
                  "Move {f} into a new folder named {d}."))
    cmd = f"mkdir -p {_q(folder)} && mv {_q(f)} {_q(folder)}/"
    moved = f"{folder}/{f}"
    return Step("move_into", say.format(d=folder, f=f), ("move_into", f, folder), files={f: body},
                actions=[_bash(cmd)], shell=[cmd],
                checks={"moved": [text(moved, body)], "not_copied": [text(moved, body), absent(f)]})


TEMPLATES = {t.__name__: t for t in (create, append, rename, copy, delete, count, replace, move_into)}
MAX_STEPS = 3


def draft(seed: int, difficulty: int) -> Draft:
    """The task of this seed with ``difficulty`` steps (distinct templates), plus one or two files no step names
    (they must survive: a guard)."""
    return draw_draft(TEMPLATES, seed, difficulty)


def draw_draft(templates: dict, seed: int, difficulty: int) -> Draft:
    """``difficulty`` distinct templates of these, drawn by seed, plus one or two guard files no step names (the
    draw order is part of every family's pinned bytes: do not reorder)."""
    d = Draw(seed, WORDS, FOLDERS, EXTS)
    names = d.rng.sample(sorted(templates), difficulty)
    steps = [templates[n](d) for n in names]
    distractors = {d.file(): _body(d.lines(1, 3)) for _ in range(d.rng.randint(1, 2))}
    return Draft(steps, d.pick(INTROS), distractors)
