"""The ``check`` family: steps whose natural command goes wrong *silently* on about half the instances, so that only
reading the result back shows it (checking one's work pays).

The trap is in the workspace, not in the wording: a file whose last line has no newline (``echo x >> f`` then
glues ``x`` onto that line, ``cat a b`` glues two files, ``wc -l`` counts one line short), or a line break written
as ``\\n`` inside ``echo "..."`` (bash's echo writes the two characters). Every such command exits 0; a read-back
(``cat f``) shows the glued or literal text. The verifier scores the end state only, as in ``files``: a step's score
is the share of its checks that pass, the reward the mean over steps.

The reference solution (what the scripted teacher plays) is *privileged*: it knows whether the file ends with a
newline and writes the right command at once (one tool call per step, no read-back). A student that imitates it
without reading the file first can only guess, so imitation alone cannot reach 1.0 on these tasks. The *careful*
solution (``Step.careful``; a generation's ``careful`` share of steps) knows nothing hidden: it looks at the file's
last byte first (``tail -c 1 f | wc -l`` prints 0 when the last line has no newline, 1 when it has) and then writes
the command that fits what it saw.
"""

from __future__ import annotations

from ._model import Draft, Draw, Step, number, text, unchanged
from .files import ANSWER, _bash, _body, _q, draw_draft

NAME = "check"
__all__ = ["ANSWER", "MAX_STEPS", "NAME", "TEMPLATES", "draft"]


def _look(path: str) -> dict:
    """``0`` when the file's last line has no newline, ``1`` when it has one."""
    return _bash(f"tail -c 1 {_q(path)} | wc -l")


def _maybe_open(d: Draw, lines: list[str]) -> tuple[str, bool]:
    """The file's text and whether its last line lacks the newline (about half the time)."""
    open_end = d.rng.random() < 0.5
    body = _body(lines)
    return (body[:-1], True) if open_end else (body, False)


def append_end(d: Draw) -> Step:
    f, line = d.file(), d.line()
    body, open_end = _maybe_open(d, d.lines(1, 3))
    say = d.pick(("Add the line '{l}' at the end of {f}.", "Append '{l}' to {f} as its last line.",
                  "Put the line '{l}' at the end of the file {f}."))
    cmd = f"printf '\\n%s\\n' {_q(line)} >> {_q(f)}" if open_end else f"echo {_q(line)} >> {_q(f)}"
    full = body + ("\n" if open_end else "")
    return Step("append_end", say.format(f=f, l=line), ("append_end", f, line, open_end), files={f: body},
                actions=[_bash(cmd)], shell=[cmd], checks={"appended": [text(f, full + line + "\n")]},
                careful=[_look(f), _bash(cmd)])


def two_lines(d: Draw) -> Step:
    f, a, b = d.file(), d.line(), d.line()
    say = d.pick(("Create {f} with two lines: '{a}' and then '{b}'.", "Write a new file {f} whose first line is "
                  "'{a}' and second line is '{b}'.", "Make a file {f} holding the line '{a}' followed by the line "
                  "'{b}'."))
    content = f"{a}\n{b}\n"
    return Step("two_lines", say.format(f=f, a=a, b=b), ("two_lines", f, a, b),
                actions=[{"tool": "write_file", "arguments": {"path": f, "content": content}}],
                shell=[f"printf '%s\\n%s\\n' {_q(a)} {_q(b)} > {_q(f)}"], checks={"written": [text(f, content)]})


def join(d: Draw) -> Step:
    a, b, c = d.file(), d.file(), d.file()
    body_a, open_end = _maybe_open(d, d.lines(1, 3))
    body_b = _body(d.lines(1, 3))
    say = d.pick(("Write the lines of {a} followed by the lines of {b} into a new file {c}.",
                  "Make a new file {c} with the lines of {a} and then the lines of {b}.",
                  "Combine {a} and then {b} into a new file {c}, line by line."))
    qa, qb, qc = _q(a), _q(b), _q(c)
    cmd = f"{{ cat {qa}; echo; cat {qb}; }} > {qc}" if open_end else f"cat {qa} {qb} > {qc}"
    joined = body_a + ("\n" if open_end else "") + body_b
    return Step("join", say.format(a=a, b=b, c=c), ("join", a, b, c, open_end), files={a: body_a, b: body_b},
                actions=[_bash(cmd)], shell=[cmd], checks={"joined": [text(c, joined)]},
                guards={"sources_kept": [unchanged(a, body_a), unchanged(b, body_b)]}, careful=[_look(a), _bash(cmd)])


def count_all(d: Draw) -> Step:
    src, dst = d.file(), d.file()
    lines = d.lines(2, 7)
    body, open_end = _maybe_open(d, lines)
    say = d.pick(("Write the number of lines in {a} to {b}.", "Count every line of {a}, the last one too, and "
                  "save the number in {b}.", "Put the line count of {a} into {b} (just the number)."))
    cmd = f"grep -c '' {_q(src)} > {_q(dst)}" if open_end else f"wc -l < {_q(src)} > {_q(dst)}"
    return Step("count_all", say.format(a=src, b=dst), ("count_all", src, dst, open_end), files={src: body},
                actions=[_bash(cmd)], shell=[cmd], checks={"counted": [number(dst, len(lines))]},
                guards={"source_kept": [unchanged(src, body)]}, careful=[_look(src), _bash(cmd)])


TEMPLATES = {t.__name__: t for t in (append_end, two_lines, join, count_all)}
MAX_STEPS = 3


def draft(seed: int, difficulty: int) -> Draft:
    """``difficulty`` distinct templates, plus one or two guard files no step names."""
    return draw_draft(TEMPLATES, seed, difficulty)
