#!/usr/bin/env bash
# Verifier for files-fix-inventory-script: inventory.py prints the documented report for the workspace CSV and a hidden CSV
# Writes ${OPENFORGE_REWARD_DIR:-/logs/verifier}/reward.json ({"reward", "checks", "guards", "details"}) and
# reward.txt. Exits 0 whenever it scored; a non-zero exit means the verifier itself broke (an infra error).
# Reward: 0 if any guard check fails (something was damaged), else the share of the other checks that pass;
# 1.0 only when every check passes. Python 3.11 stdlib only.
set -eu
export OPENFORGE_WORKSPACE="${OPENFORGE_WORKSPACE:-/workspace}"
export OPENFORGE_TESTS="${OPENFORGE_TESTS:-/tests}"
export OPENFORGE_ENVIRONMENT="${OPENFORGE_ENVIRONMENT:-/environment}"
export OPENFORGE_REWARD_DIR="${OPENFORGE_REWARD_DIR:-/logs/verifier}"
export OPENFORGE_SERVICE_PORT="${OPENFORGE_SERVICE_PORT:-8931}"
mkdir -p "$OPENFORGE_REWARD_DIR"
rm -f "$OPENFORGE_REWARD_DIR/reward.json" "$OPENFORGE_REWARD_DIR/reward.txt"
# python3 -I (isolated): no PYTHON* variables, no user site, neither the cwd nor a script folder on sys.path,
# so nothing the harness left in its workspace stands in for a standard-library module; paths are absolute.
exec python3 -I - <<'PY'
import csv
import hashlib
import io
import json
import os
import stat
import sys
from decimal import Decimal, InvalidOperation, ROUND_HALF_UP
from pathlib import Path

WS = Path(os.environ["OPENFORGE_WORKSPACE"])
TESTS = Path(os.environ["OPENFORGE_TESTS"])
ENV_DIR = Path(os.environ["OPENFORGE_ENVIRONMENT"])
REWARD_DIR = Path(os.environ["OPENFORGE_REWARD_DIR"])
WS_REAL = Path(os.path.realpath(WS))
details = {}


def finish(checks, guards=()):
    failed_guards = [g for g in guards if not checks[g]]
    scored = [k for k in checks if k not in guards]
    if failed_guards:
        reward = 0.0
    else:
        reward = sum(bool(checks[k]) for k in scored) / len(scored)
    result = {"reward": round(reward, 4), "checks": {k: bool(v) for k, v in checks.items()},
              "guards": list(guards), "details": details}
    (REWARD_DIR / "reward.json").write_text(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
    (REWARD_DIR / "reward.txt").write_text(f"{result['reward']}\n")
    print(json.dumps(result, sort_keys=True, default=str))
    sys.exit(0)


def ws_file(path):
    """A workspace path resolved, when it is a regular file inside the workspace. A symlink that leads out of it
    (to /tests, /logs/verifier, ...) or to something that is not a regular file raises OSError, so every caller
    treats it as missing; details["refused"] says which path and why."""
    real = Path(os.path.realpath(path))
    rel = os.path.relpath(path, WS)
    if real != WS_REAL and WS_REAL not in real.parents:
        details.setdefault("refused", {})[rel] = "a symlink out of the workspace"
        raise PermissionError(f"{rel}: a symlink out of the workspace")
    if not stat.S_ISREG(os.stat(real).st_mode):     # FileNotFoundError when missing: that is no refusal
        details.setdefault("refused", {})[rel] = "not a regular file"
        raise IsADirectoryError(f"{rel}: not a regular file")
    return real


def ws_bytes(path):
    """The bytes of a workspace file (see ws_file); raises OSError when it is missing or refused."""
    return ws_file(path).read_bytes()


def sha256(path):
    """The workspace file's sha256, or None when it is missing, refused, or unreadable."""
    try:
        return hashlib.sha256(ws_bytes(path)).hexdigest()
    except OSError:
        return None


def read_csv(path):
    """(header, rows) of a workspace CSV, cells stripped, blank lines dropped; raises when missing or unreadable."""
    text = ws_bytes(path).decode("utf-8-sig")
    rows = [[c.strip() for c in r] for r in csv.reader(io.StringIO(text, newline="")) if any(c.strip() for c in r)]
    if not rows:
        raise ValueError(f"{path} is empty")
    return rows[0], rows[1:]


def dec(text):
    """A number as the agent wrote it (plain, or with thousands separators); None if it is not a sane one."""
    try:
        d = Decimal(str(text).strip().replace(",", ""))
    except (InvalidOperation, ValueError):
        return None
    return d if d.is_finite() and abs(d) < Decimal("1e15") else None


def cents(x):
    return Decimal(x).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)

import signal
import subprocess
import tempfile

ORIGINAL_CSV = "95f7c937410a3331ab3cb984dc27272d27f81c54e5d0843040a013015fb908fa"


def expected_report(path):
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    items = []
    for sku, name, qty, price in rows[1:]:
        q = int(qty) if qty.strip() else 0
        p = float(price)
        items.append((sku, name, q, p, q * p))
    items.sort(key=lambda it: (-it[4], it[0]))
    out = [f"{s:<8} {n:<24} {q:>5} x {p:>8.2f} = {v:>10.2f}" for s, n, q, p, v in items]
    out += ["", f"ITEMS: {len(items)}", f"UNITS: {sum(it[2] for it in items)}",
            f"TOTAL VALUE: {sum(it[4] for it in items):.2f}"]
    return out


def run_script(script, csv_path):
    """Run the agent's script on a copy of the CSV in a scratch folder, as a child process in its own session (never
    imported here: it is harness code), without the verifier's variables, for at most 20 s; whatever it started is
    killed with it. PYTHONSAFEPATH goes too, so it imports its own modules as `python3 inventory.py` would."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENFORGE_") and k != "PYTHONSAFEPATH"}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.csv"
        data.write_bytes(Path(csv_path).read_bytes())
        proc = subprocess.Popen([sys.executable, str(script), str(data)], cwd=tmp, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            return None, "timed out"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
    if proc.returncode != 0:
        return None, err.decode(errors="replace")[-400:]
    return [line.rstrip() for line in out.decode(errors="replace").rstrip("\n").split("\n")], ""


checks = {"inventory_csv_unchanged": sha256(WS / "inventory.csv") == ORIGINAL_CSV}
try:
    script = ws_file(WS / "inventory.py")
except OSError as exc:
    script, missing = None, f"inventory.py missing or refused: {exc.__class__.__name__}"
for label, path in (("workspace_csv", TESTS / "workspace_inventory.csv"), ("hidden_csv", TESTS / "hidden_inventory.csv")):
    got, err = run_script(script, path) if script is not None else (None, missing)
    want = expected_report(path)
    checks[f"{label}_runs"] = got is not None
    checks[f"{label}_report_exact"] = got == want
    if got is None:
        details[label] = err
    elif got != want:
        diff = [i for i in range(max(len(got), len(want))) if i >= len(got) or i >= len(want) or got[i] != want[i]]
        i = diff[0]
        details[label] = {"first_bad_line": i + 1, "expected": want[i] if i < len(want) else None,
                          "got": got[i] if i < len(got) else None}
finish(checks, guards=("inventory_csv_unchanged",))
PY
