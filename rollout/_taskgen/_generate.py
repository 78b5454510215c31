"""Generation: which seeds make a set's tasks, which split each lands in, and writing the folders.

- **Seeds.** A generation with seed ``S`` draws candidate tasks from the seeds ``S * 100000 + k`` (k = 0, 1, ...);
  a task is a pure function of (family, task seed, difficulty), and its id names all three, so a task id means the
  same bytes in every generation and every store.
- **Splits.** A task's split is decided by a hash of what its instruction names (templates, file names, words;
  not the wording, not file contents): one key in five is held out. The same instruction can therefore never be in
  both splits, and a near-duplicate (same key, other wording) never leaks across either. Within a split a key is
  used once.
- **Difficulty.** The i-th task of a split has ``difficulties[i % len(difficulties)]`` steps, so the mix is even.
- **Prefix-stable.** The first N tasks of a split are the same whatever N and the other split's size.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from . import check, files, plans, recover
from ._render import GENERATOR, render, task_id

FAMILIES: dict[str, ModuleType] = {m.NAME: m for m in (files, check, recover, plans)}
SPLITS = ("train", "heldout")
SEED_STRIDE = 100_000
HELDOUT_ONE_IN = 5
MANIFEST = "taskgen.json"


class TaskGenError(ValueError):
    """A generation that cannot be done as asked; the message names the value, the rule and the fix."""


@dataclass
class Plan:
    """What a generation would write: ``tree`` maps a path under the output folder to (bytes, executable)."""

    family: str
    tasks: list[dict] = field(default_factory=list)
    tree: dict[str, tuple[bytes, bool]] = field(default_factory=dict)

    def paths(self, out: Path) -> list[Path]:
        return [out / t["split"] / t["id"] for t in self.tasks]


def task_families() -> dict[str, list[str]]:
    """Each known family with the names of its templates."""
    return {name: sorted(mod.TEMPLATES) for name, mod in sorted(FAMILIES.items())}


def family(name: str) -> ModuleType:
    try:
        return FAMILIES[name]
    except KeyError:
        raise TaskGenError(f"task family {name!r} is unknown; known families: {', '.join(sorted(FAMILIES))}") \
            from None


def split_of(family_name: str, key: tuple) -> str:
    digest = hashlib.sha256(json.dumps([family_name, key]).encode()).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") % HELDOUT_ONE_IN == 0 else "train"


def plan(family_name: str, *, train: int, heldout: int, seed: int, difficulties=None, careful: float = 0.0) -> Plan:
    """``difficulties`` None: the family's own (``DIFFICULTIES``, else 1, 2, 3). ``careful``: the share of steps
    whose reference solution (``solution/actions.json``, what the scripted teacher plays) is the careful one, which
    looks first or recovers from the error instead of knowing what the step hides (``check`` and ``recover``)."""
    fam = family(family_name)
    if difficulties is None:
        difficulties = getattr(fam, "DIFFICULTIES", (1, 2, 3))
    difficulties = _check(fam, train=train, heldout=heldout, seed=seed, difficulties=difficulties, careful=careful)
    p = Plan(family_name)
    for split, n in zip(SPLITS, (train, heldout)):
        for task_seed, diff, draft in _walk(fam, split, n, seed, difficulties):
            tid = task_id(family_name, task_seed, diff)
            p.tasks.append({"id": tid, "split": split, "seed": task_seed, "difficulty": diff,
                            "template": "+".join(s.template for s in draft.steps)})
            for rel, content in render(draft, family=family_name, seed=task_seed, split=split,
                                       answer=fam.ANSWER, careful=careful).items():
                p.tree[f"{split}/{tid}/{rel}"] = content
    manifest = {"generator": GENERATOR, "family": family_name, "seed": seed, "train": train, "heldout": heldout,
                "difficulties": list(difficulties), "heldout_rule": f"one instruction key in {HELDOUT_ONE_IN}",
                "tasks": p.tasks}
    if careful:
        manifest["careful"] = careful  # absent at 0: the manifests of generations before the option stay the same
    p.tree[MANIFEST] = (json.dumps(manifest, indent=1, sort_keys=True).encode() + b"\n", False)
    return p


def _check(fam: ModuleType, *, train: int, heldout: int, seed: int, difficulties, careful: float = 0.0
           ) -> tuple[int, ...]:
    for name, n in (("train", train), ("heldout", heldout)):
        if not isinstance(n, int) or n < 0:
            raise TaskGenError(f"--{name} {n!r}: the number of tasks must be 0 or more")
    if train + heldout == 0:
        raise TaskGenError("--train 0 --heldout 0: nothing to generate; ask for at least one task")
    if isinstance(careful, bool) or not isinstance(careful, int | float) or not 0 <= careful <= 1:
        raise TaskGenError(f"--careful {careful!r}: the share of steps whose reference solution looks first instead "
                           "of knowing what the step hides is a number from 0 to 1, e.g. 0.5")
    if not isinstance(seed, int) or not 0 <= seed < 10**9:
        raise TaskGenError(f"--seed {seed!r}: pass an integer from 0 to 999999999")
    diffs = tuple(difficulties)
    bad = [d for d in diffs if not isinstance(d, int) or not 1 <= d <= fam.MAX_STEPS]
    if not diffs or bad:
        raise TaskGenError(f"--difficulty {','.join(map(str, diffs)) or '(none)'}: the {fam.NAME} family makes "
                           f"tasks of 1 to {fam.MAX_STEPS} steps; pass numbers in that range, e.g. 1,2,3")
    return diffs


def _walk(fam: ModuleType, split: str, n: int, seed: int, difficulties: tuple[int, ...]):
    seen: set[tuple] = set()
    k = 0
    while len(seen) < n:
        if k >= SEED_STRIDE:
            raise TaskGenError(f"the {fam.NAME} family ran out of distinct {split} tasks after {len(seen)} of {n} "
                               f"({SEED_STRIDE} seeds tried); ask for fewer tasks")
        diff = difficulties[len(seen) % len(difficulties)]
        task_seed = seed * SEED_STRIDE + k
        k += 1
        draft = fam.draft(task_seed, diff)
        if draft.key in seen or split_of(fam.NAME, draft.key) != split:
            continue
        seen.add(draft.key)
        yield task_seed, diff, draft


def write(p: Plan, out: Path) -> bool:
    """Write the plan into ``out`` (True), or find it already there byte for byte (False). A folder holding
    anything else is refused: tasks of two generations must not mix."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise TaskGenError(f"--out {out}: is a file, not a folder; pass a folder (it is created if missing)")
    if out.is_dir() and any(out.iterdir()):
        existing = _read_tree(out)
        if existing == p.tree:
            return False
        raise TaskGenError(f"--out {out}: {_describe_conflict(out, existing, p.tree)}; pass an empty or new "
                           f"folder to --out, or delete {out} to regenerate it")
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for rel, (content, executable) in p.tree.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            path.chmod(0o755 if executable else 0o644)
        for d in [tmp, *(q for q in tmp.rglob("*") if q.is_dir())]:
            d.chmod(0o755)
        if out.is_dir():
            out.rmdir()
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def _read_tree(root: Path) -> dict[str, tuple[bytes, bool]]:
    tree = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() or path.is_symlink():
            rel = path.relative_to(root).as_posix()
            tree[rel] = (path.read_bytes() if path.is_file() else b"", bool(path.lstat().st_mode & 0o100))
    return tree


def _describe_conflict(out: Path, existing: dict, wanted: dict) -> str:
    try:
        old = json.loads(existing[MANIFEST][0])
        what = (f"holds tasks of another generation (family {old['family']}, seed {old['seed']}, train "
                f"{old['train']}, heldout {old['heldout']}, difficulties {old['difficulties']}, {old['generator']})")
    except (KeyError, ValueError, TypeError):
        what = f"holds files that are not a task generation ({MANIFEST} missing or unreadable)"
    differ = sorted(set(existing) ^ set(wanted) | {k for k in set(existing) & set(wanted) if existing[k] != wanted[k]})
    return f"{what}; {len(differ)} file(s) differ from this generation, e.g. {differ[0]}"


def generate_tasks(family: str, out: str | Path, *, train: int = 0, heldout: int = 0, seed: int = 0,
                   difficulties=None, careful: float = 0.0) -> list[Path]:
    """Generate ``train`` + ``heldout`` task folders of ``family`` into ``out/train/`` and ``out/heldout/`` (plus
    ``out/taskgen.json``, the generation's manifest); the same arguments always give the same bytes, and a
    folder that already holds exactly them is left alone. Returns the task folders, train first."""
    p = plan(family, train=train, heldout=heldout, seed=seed, difficulties=difficulties, careful=careful)
    write(p, Path(out))
    return p.paths(Path(out))
