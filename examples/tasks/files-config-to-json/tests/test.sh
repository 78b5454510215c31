#!/usr/bin/env bash
# Verifier for files-config-to-json: config.json holds the effective (overridden) values with the right JSON types
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

ORIGINAL = {"config/app.ini": "a58a95f3f6b70b8e3d139820efb60520aabfe93dd7a6337f78828ee5f9dd4e88", "config/.env": "1943825d4353996a7b4a5bb23afa2d1a4e015ea471f25b026b651f792a3f5fc9"}
EXPECTED = {"db_host": "10.0.3.17", "db_port": 5432, "db_name": "shop", "workers": 8, "debug": False,
            "log_level": "info", "allowed_hosts": ["shop.example.com", "api.example.com"], "cache_ttl_seconds": 120}
checks = {"inputs_unchanged": all(sha256(WS / k) == v for k, v in ORIGINAL.items())}
try:
    got = json.loads(ws_bytes(WS / "config.json").decode("utf-8"))
except (OSError, ValueError) as exc:
    got = None
    details["config.json"] = f"missing or not JSON: {exc.__class__.__name__}"
checks["valid_json_object"] = isinstance(got, dict)
got = got if isinstance(got, dict) else {}
for key, want in EXPECTED.items():
    have = got.get(key)
    # bool is a subclass of int in Python: compare types exactly so "debug": 0 or "workers": true do not pass
    checks[key] = type(have) is type(want) and have == want
    if not checks[key]:
        details[key] = {"expected": want, "got": have}
checks["no_extra_keys"] = bool(got) and set(got) == set(EXPECTED)
finish(checks, guards=("inputs_unchanged",))
PY
