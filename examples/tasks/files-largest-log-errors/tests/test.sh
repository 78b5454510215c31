#!/usr/bin/env bash
# Verifier for files-largest-log-errors: error_summary.json describes the ERROR lines of the largest log
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

ORIGINAL = {
    "app-2024-05-01.log": "826e5e22199913646c4b772e889e549c574dad809ada1002d80bf323bd627e4b",
    "app-2024-05-02.log": "475216f09d173a4d95a6a236bb5f6b886cb6cc5fe9aa84a170f95309f2057ffd",
    "app-2024-05-03.log": "312f9092e0e986f83ee09b7d8f0c18e8a1115a0fe67123d153c04d188b902aa8",
    "app-2024-05-04.log": "c52e667c17de787eb8ff70a820c54e42def19ef42772b3c2089c16a91216857b"
}
EXPECTED = {
    "file": "app-2024-05-02.log",
    "total_errors": 14,
    "by_component": {
        "api": 2,
        "auth": 3,
        "cache": 3,
        "db": 4,
        "worker": 2
    },
    "first_error_at": "2024-05-02T09:06:20Z",
    "last_error_at": "2024-05-02T13:39:09Z"
}
checks = {"logs_unchanged": all(sha256(WS / "logs" / k) == v for k, v in ORIGINAL.items())}
try:
    got = json.loads(ws_bytes(WS / "error_summary.json").decode("utf-8"))
except (OSError, ValueError) as exc:
    got = None
    details["error_summary.json"] = f"missing or not JSON: {exc.__class__.__name__}"
got = got if isinstance(got, dict) else {}
checks["largest_file_found"] = got.get("file") == EXPECTED["file"]
checks["total_errors"] = type(got.get("total_errors")) is int and got.get("total_errors") == EXPECTED["total_errors"]
by = got.get("by_component")
checks["by_component"] = isinstance(by, dict) and by == EXPECTED["by_component"]
checks["first_and_last_error_at"] = (got.get("first_error_at"), got.get("last_error_at")) == \
    (EXPECTED["first_error_at"], EXPECTED["last_error_at"])
for k in ("file", "total_errors", "by_component"):
    if got.get(k) != EXPECTED[k]:
        details[k] = {"expected": EXPECTED[k], "got": got.get(k)}
finish(checks, guards=("logs_unchanged",))
PY
