"""Verifier of a generated task (copied into the task as tests/verify.py; Python 3 standard library only).

Reads ``$OPENFORGE_TESTS/expected.json`` (written by the generator, never visible to the harness) and checks the
workspace (the cwd) against it; writes ``$OPENFORGE_REWARD_DIR/reward.json`` and ``reward.txt`` last.

Scoring: a check passes when all its conditions hold. A step's score is the share of its checks that pass; the
reward is the mean of the steps' scores, or 0 when any guard fails (an input that had to stay, or a file no step
names, was changed or removed). An untouched workspace scores 0: every non-guard check needs a change.

Hostile end states: every path is looked up with lstat component by component, so a symlink anywhere on the way
(to /tests, to another file) fails the condition instead of being followed; only regular files are read (a FIFO
cannot hang the verifier), at most 64 KiB of them; expected values come only from expected.json.
A workspace the harness made unreachable (chmod 000) scores 0 rather than crashing the verifier (a crash is an infra
error, retried and excluded: a harness must not turn its failure into one). Exit 0 whenever it scored; exit 2 when
expected.json is unreadable (the verifier itself is broken: an infra error).
"""

import hashlib
import json
import os
import stat
import sys

MAX_BYTES = 64 * 1024


def node(path):
    """'missing', 'file', 'dir' or 'other' (a symlink anywhere on the way, a FIFO, a device, ...)."""
    parts = [p for p in path.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        return "other"
    cur = "."
    for i, part in enumerate(parts):
        cur = os.path.join(cur, part)
        try:
            mode = os.lstat(cur).st_mode
        except FileNotFoundError:
            return "missing"
        except OSError:
            return "other"
        last = i == len(parts) - 1
        if stat.S_ISLNK(mode) or not (stat.S_ISDIR(mode) or (last and stat.S_ISREG(mode))):
            return "other"
    return "file" if stat.S_ISREG(mode) else "dir"


def read(path):
    """The bytes of a regular file reached without a symlink, or None."""
    if node(path) != "file":
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_BYTES + 1)
    return data if len(data) <= MAX_BYTES else None


def holds(cond):
    if "absent" in cond:
        return node(cond["absent"]) == "missing"
    if "unchanged" in cond:
        data = read(cond["unchanged"])
        return data is not None and hashlib.sha256(data).hexdigest() == cond["sha256"]
    path = cond.get("text", cond.get("number"))
    data = read(path)
    try:
        got = data.decode("utf-8") if data is not None else None
    except UnicodeDecodeError:
        return False
    if got is None:
        return False
    if "text" in cond:
        return got == cond["equals"] or got + "\n" == cond["equals"]
    value = got.strip()
    return value.isdigit() and int(value) == cond["equals"]


def score(expected, holds=holds):
    checks, steps, failed_guards = {}, [], []
    for i, step in enumerate(expected["steps"], 1):
        passed = []
        for name, conds in sorted(step["checks"].items()):
            ok = all(holds(c) for c in conds)
            checks[f"step{i}_{name}"] = ok
            passed.append(ok)
        steps.append({"step": i, "template": step["template"], "score": round(sum(passed) / len(passed), 4)})
    for name, conds in sorted(expected["guards"].items()):
        ok = all(holds(c) for c in conds)
        checks["guard_" + name] = ok
        if not ok:
            failed_guards.append(name)
    reward = 0.0 if failed_guards else sum(s["score"] for s in steps) / len(steps)
    return {"reward": round(reward, 4), "checks": checks, "guards": sorted("guard_" + g for g in expected["guards"]),
            "details": {"steps": steps, "failed_guards": failed_guards}}


def main():
    tests = os.environ.get("OPENFORGE_TESTS", "/tests")
    reward_dir = os.environ.get("OPENFORGE_REWARD_DIR", "/logs/verifier")
    try:
        with open(os.path.join(tests, "expected.json"), encoding="utf-8") as fh:
            expected = json.load(fh)
    except (OSError, ValueError) as exc:
        print(f"verify.py: cannot read expected.json: {exc}", file=sys.stderr)
        return 2
    try:
        os.chdir(os.environ.get("OPENFORGE_WORKSPACE", "/workspace"))
        result = score(expected)
    except OSError as exc:     # the harness made its workspace unreachable: nothing in it counts
        result = score(expected, holds=lambda cond: False)
        result["details"]["workspace_unreachable"] = str(exc)
    text = json.dumps(result, indent=2, sort_keys=True) + "\n"
    with open(os.path.join(reward_dir, "reward.json"), "w", encoding="utf-8") as fh:
        fh.write(text)
    with open(os.path.join(reward_dir, "reward.txt"), "w", encoding="utf-8") as fh:
        fh.write(f"{result['reward']}\n")
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
