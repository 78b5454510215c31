"""Which train tasks the teacher demonstrates, and the order GRPO rounds draw train tasks in.

By default the demonstrations are the first ``demo_tasks`` train tasks, split evenly over the families (each family's
train tasks cycle through its difficulties, so a third of them are one-step tasks). ``demo_mix`` weights the
families (``check=2,recover=2``: those two get twice the share of the others) and ``demo_min_steps`` demonstrates
only tasks of at least that many steps. Both exist for one measured reason (README, 2026-12-07): with even
demonstrations SFT solved almost none of the two- and three-step ``check`` and ``recover`` tasks in any of 4 samples,
so GRPO's groups there all failed alike and the rounds had no spread of reward to learn from on those families.
"""

from __future__ import annotations

import itertools


class DemoMixError(ValueError):
    """A ``--demo-mix`` or ``--demo-min-steps`` that cannot be met; the message says what to pass."""


def parse_mix(text: str) -> dict[str, float]:
    """``"check=2,recover=2"`` -> ``{"check": 2.0, "recover": 2.0}``; families not named weigh 1."""
    mix: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if not sep or not name.strip() or not weight >= 0 or weight == float("inf"):
            raise DemoMixError(f"--demo-mix {text!r}: {part!r} is not FAMILY=WEIGHT with a weight of 0 or more; "
                               "pass e.g. check=2,recover=2 (families not named weigh 1)")
        mix[name.strip()] = weight
    return mix


def shares(total: int, families: tuple[str, ...], mix: dict[str, float]) -> dict[str, int]:
    """``total`` demonstrations over the families in proportion to their weights (1 where ``mix`` names none),
    largest remainder first, ties to the family listed first. Even weights give the loop's old even split (the
    first ``total % n`` families one more)."""
    unknown = sorted(set(mix) - set(families))
    if unknown:
        raise DemoMixError(f"--demo-mix names {', '.join(unknown)}, not among the loop's families "
                           f"{', '.join(families)}; name only those")
    weights = [mix.get(f, 1.0) for f in families]
    if sum(weights) <= 0:
        raise DemoMixError(f"--demo-mix gives every family weight 0; give at least one of {', '.join(families)} "
                           "a weight above 0")
    exact = [total * w / sum(weights) for w in weights]
    out = [int(x) for x in exact]
    order = sorted(range(len(families)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[:total - sum(out)]:
        out[i] += 1
    return dict(zip(families, out))


def pick_demonstrations(per_family: dict[str, list], counts: dict[str, int], min_steps: int = 1) -> list:
    """Of each family's train tasks (in generation order), the first ``counts[family]`` of at least ``min_steps``
    steps (a task's ``metadata.difficulty``); families in ``per_family``'s order."""
    demos = []
    for family, tasks in per_family.items():
        fit = [t for t in tasks if _meta(t).get("difficulty", 1) >= min_steps]
        want = counts.get(family, 0)
        if len(fit) < want:
            raise DemoMixError(f"the {family} family has {len(fit)} train tasks of {min_steps} or more steps, and "
                               f"the demonstrations want {want} of them; raise --train-tasks, lower --demo-tasks "
                               f"or --demo-min-steps, or weigh {family} less in --demo-mix")
        demos += fit[:want]
    return demos


def grpo_pool(train: list, demos: list) -> list:
    """The order GRPO rounds draw train tasks in: first those the teacher did not demonstrate (new instances, where
    the policy has to generalise as on held-out tasks, and where SFT's memory of a demonstration does not make all
    of a group succeed alike), then the demonstrated ones. In the first part the families take turns, and within a
    family its difficulties (each in generation order), so that a round's draws hold every family and difficulty
    whichever tasks the demonstrations took: with ``--demo-min-steps 2`` the undemonstrated tasks at the head of a
    family were its one-step ones, and two rounds of 64 groups drew 2 multi-step ``check`` groups (README,
    2026-12-07, evening). With even demonstrations this is the order the train tasks already had."""
    rest = [t for t in train if t not in demos]
    by_family: dict = {}
    for t in rest:
        meta = _meta(t)
        by_family.setdefault(meta.get("family"), {}).setdefault(meta.get("difficulty"), []).append(t)
    per_family = [take_turns(list(by_steps.values())) for by_steps in by_family.values()]
    return take_turns(per_family) + [t for t in train if t in demos]


def take_turns(lists: list[list]) -> list:
    """The lists' items, first of each, then second of each, ... (shorter lists drop out)."""
    return [t for row in itertools.zip_longest(*lists, fillvalue=_NONE) for t in row if t is not _NONE]


_NONE = object()


def task_kind(task) -> str:
    """``"check 2-step"``: a generated task's family and steps, what the rounds' draws are counted by; ``"other"``
    for a task without them."""
    meta = _meta(task)
    return f"{meta['family']} {meta.get('difficulty', 1)}-step" if meta.get("family") else "other"


def _meta(task) -> dict:
    """A generated task's metadata (family, difficulty: its steps); empty for anything else (its order is kept)."""
    return getattr(getattr(task, "config", None), "metadata", None) or {}
