#!/usr/bin/env bash
# Verifier for finance-monthly-balance: monthly_balance.csv has inflow/outflow/closing balance for every month of the period
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

def compare_rows(path, header, expected, numeric_cols, tol=Decimal("0.005")):
    """Checks for one output CSV: header exact, same row keys, numbers within tol, same order."""
    out = {"exists": False, "header": False, "rows": False, "order": False}
    try:
        got_header, got = read_csv(path)
    except (OSError, ValueError, UnicodeDecodeError, csv.Error) as exc:
        details[Path(path).name] = f"unreadable: {exc.__class__.__name__}: {exc}"
        return out
    out["exists"] = True
    out["header"] = [h.lower() for h in got_header] == header
    if not out["header"]:
        details[Path(path).name + " header"] = {"expected": header, "got": got_header}
        return out

    def same(g, w):
        if len(g) != len(w):
            return False
        for i, (a, b) in enumerate(zip(g, w)):
            if i in numeric_cols:
                da = dec(a)
                if da is None or abs(da - Decimal(b)) > tol:
                    return False
            elif a != b:
                return False
        return True

    remaining = list(expected)
    unmatched = []
    for g in got:
        hit = next((w for w in remaining if same(g, w)), None)
        if hit is None:
            unmatched.append(g)
        else:
            remaining.remove(hit)
    out["rows"] = not remaining and not unmatched
    out["order"] = out["rows"] and all(same(g, w) for g, w in zip(got, expected))
    if not out["rows"]:
        details[Path(path).name] = {"wrong_or_extra_rows": unmatched[:10], "missing_rows": remaining[:10]}
    return out

ORIGINAL = {"statement.csv": "64b14d92de25b58e5976c82d2771dfe59987f069f2f85d7bdaf0c379c416fa3c", "account.txt": "36bdeb077049e8aae6867c57c7530efd08037e24456b0aed28c1964b02038bd3"}
EXPECTED = [
    [
        "2024-01",
        "5130.23",
        "2453.04",
        "5177.19"
    ],
    [
        "2024-02",
        "4905.97",
        "2685.01",
        "7398.15"
    ],
    [
        "2024-03",
        "0.00",
        "0.00",
        "7398.15"
    ],
    [
        "2024-04",
        "8105.75",
        "2824.80",
        "12679.10"
    ],
    [
        "2024-05",
        "0.00",
        "2212.96",
        "10466.14"
    ]
]
checks = {"inputs_unchanged": all(sha256(WS / k) == v for k, v in ORIGINAL.items())}
header = ["month", "inflow", "outflow", "closing_balance"]
res = compare_rows(WS / "monthly_balance.csv", header, EXPECTED, numeric_cols={1, 2, 3})
checks.update({"output_exists": res["exists"], "header": res["header"], "all_rows_exact": res["rows"],
               "chronological": res["order"]})
try:
    _, got = read_csv(WS / "monthly_balance.csv")
except Exception:
    got = []
months = [row[0] for row in got if row]
checks["every_month_listed"] = months == [row[0] for row in EXPECTED]
final = dec(got[-1][3]) if got and len(got[-1]) == 4 else None
checks["final_closing_balance"] = final is not None and abs(final - Decimal(EXPECTED[-1][3])) <= Decimal("0.005")
finish(checks, guards=("inputs_unchanged",))
PY
