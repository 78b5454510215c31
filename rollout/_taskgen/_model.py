"""What a template produces (a ``Step``), what a family draws (a ``Draft``), and the seeded drawing helper.

A step is one instruction sentence with everything needed to check and to solve it: the workspace files it needs,
its reference tool calls (the react harness's), its shell form (``solve.sh``), its checks (each a list of
conditions that must all hold for the check to pass) and its guards (conditions a do-nothing run also meets, such
as "the input is unchanged": a failed guard zeroes the reward). ``key`` is what the instruction names (template and
the names and words it mentions, not the wording): the split and the de-duplication are decided on it.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field


def text(path: str, equals: str) -> dict:
    """``path`` is a regular file (no symlink on the way) whose UTF-8 text is ``equals`` (the final newline may be
    missing)."""
    return {"text": path, "equals": equals}


def number(path: str, equals: int) -> dict:
    """``path`` is a regular file holding just the integer ``equals`` (surrounding whitespace allowed)."""
    return {"number": path, "equals": equals}


def absent(path: str) -> dict:
    """Nothing (no file, folder or link) at ``path``."""
    return {"absent": path}


def unchanged(path: str, content: str) -> dict:
    """``path`` is a regular file with exactly these bytes (pinned by sha256)."""
    return {"unchanged": path, "sha256": hashlib.sha256(content.encode()).hexdigest()}


@dataclass
class Step:
    template: str
    text: str
    key: tuple
    actions: list[dict]
    shell: list[str]
    checks: dict[str, list[dict]]
    guards: dict[str, list[dict]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    # The reference solution of a solver without the step's hidden fact (whether a file ends with a newline, whether
    # a folder exists, where a file lives): it looks first, or meets the error, and acts on what it saw. None: the
    # step hides nothing (``actions`` is what anyone would do). A generation's ``careful`` share of steps use it.
    careful: list[dict] | None = None


@dataclass
class Draft:
    """One task as a family drew it, before it becomes a folder."""

    steps: list[Step]
    intro: str
    distractors: dict[str, str]
    # One check over the whole end state instead of the steps' own (whose checks are then empty): the reward is 1
    # when all its conditions hold, else 0 (the ``plan`` family: only completing every step counts).
    whole: dict[str, list[dict]] | None = None

    @property
    def key(self) -> tuple:
        return tuple(s.key for s in self.steps)

    @property
    def instruction(self) -> str:
        if len(self.steps) == 1:
            return self.steps[0].text
        return "\n".join([self.intro, *(f"{i}. {s.text}" for i, s in enumerate(self.steps, 1))])


class Draw:
    """A seeded ``random.Random`` that hands out names no other step of the same task has used."""

    def __init__(self, seed: int, words: tuple[str, ...], folders: tuple[str, ...], exts: tuple[str, ...]):
        self.rng = random.Random(seed)
        self.words, self.folders, self.exts = words, folders, exts
        self.used: set[str] = set()

    def _fresh(self, make) -> str:
        for _ in range(1000):
            name = make()
            if name not in self.used:
                self.used.add(name)
                return name
        raise RuntimeError("name space exhausted: widen the family's word list")

    def file(self) -> str:
        return self._fresh(lambda: f"{self.rng.choice(self.words)}_{self.rng.randint(1, 99)}"
                                   f".{self.rng.choice(self.exts)}")

    def folder(self) -> str:
        return self._fresh(lambda: f"{self.rng.choice(self.folders)}{self.rng.randint(1, 9)}")

    def word(self, avoid: tuple[str, ...] = ()) -> str:
        return self.rng.choice([w for w in self.words if w not in avoid])

    def line(self, avoid: tuple[str, ...] = ()) -> str:
        """Two or three words; none of them contains (or is contained in) a word of ``avoid``."""
        pool = [w for w in self.words if not any(a in w or w in a for a in avoid)]
        return " ".join(self.rng.choice(pool) for _ in range(self.rng.randint(2, 3)))

    def lines(self, lo: int, hi: int, avoid: tuple[str, ...] = ()) -> list[str]:
        return [self.line(avoid) for _ in range(self.rng.randint(lo, hi))]

    def pick(self, options):
        return self.rng.choice(options)
