#!/usr/bin/env bash
# Verifier for finance-reconcile-ledgers: reconciliation.csv lists exactly the unmatched and mismatched references
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

ORIGINAL = {"bank.csv": "f3c3f9a2ca5ade25a754cbc33eefe50f00217b35b0e70aab84c2697dbd3274fb", "ledger.csv": "b4e7bd592908a234b7b7fd754993b4ce6274b4fc886e41e44d5462cffdc1896f"}
EXPECTED = [
    [
        "PAY-24112",
        "3970.94",
        "",
        "missing_in_ledger"
    ],
    [
        "PAY-24118",
        "3039.27",
        "3030.27",
        "amount_mismatch"
    ],
    [
        "PAY-24127",
        "",
        "742.82",
        "missing_in_bank"
    ],
    [
        "PAY-24139",
        "3325.97",
        "3425.97",
        "amount_mismatch"
    ],
    [
        "PAY-24151",
        "1336.19",
        "",
        "missing_in_ledger"
    ],
    [
        "PAY-24163",
        "",
        "-2433.18",
        "missing_in_bank"
    ],
    [
        "PAY-24175",
        "",
        "-1345.68",
        "missing_in_bank"
    ]
]
checks = {"inputs_unchanged": all(sha256(WS / k) == v for k, v in ORIGINAL.items())}


def canonical(row):
    """Amounts as Decimal text (blank stays blank) so 1234.5 and 1234.50 compare equal; other cells as written."""
    if len(row) != 4:
        return tuple(row)
    ref, b, l, status = row
    def amount(text):
        if text == "":
            return ""
        d = dec(text)
        return "not-a-number" if d is None else str(cents(d))
    return (ref, amount(b), amount(l), status)


want = [canonical(r) for r in EXPECTED]
try:
    header, rows = read_csv(WS / "reconciliation.csv")
    got = [canonical(r) for r in rows]
except (OSError, ValueError, UnicodeDecodeError, csv.Error) as exc:
    header, got = None, None
    details["reconciliation.csv"] = f"unreadable: {exc.__class__.__name__}"
checks["output_exists"] = got is not None
checks["header"] = header is not None and [h.lower() for h in header] == ["reference", "bank_amount", "ledger_amount", "status"]
got = got or []
for status in ("missing_in_ledger", "missing_in_bank", "amount_mismatch"):
    checks[status] = sorted(r for r in got if r[-1] == status) == sorted(r for r in want if r[-1] == status)
checks["no_reconciled_rows_listed"] = bool(got) and {r[0] for r in got} <= {r[0] for r in want}
checks["sorted_by_reference"] = bool(got) and sorted(got) == sorted(want) and got == want
if sorted(got) != sorted(want):
    details["missing_rows"] = [list(r) for r in want if r not in got]
    details["wrong_or_extra_rows"] = [list(r) for r in got if r not in want][:10]
finish(checks, guards=("inputs_unchanged",))
PY
