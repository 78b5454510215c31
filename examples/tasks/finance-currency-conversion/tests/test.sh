#!/usr/bin/env bash
# Verifier for finance-currency-conversion: expenses_eur.csv and totals_eur.csv use the month's rate, rounded to cents
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

ORIGINAL = {"expenses.csv": "ad82f53961939042ecc7ce24c961ee52598853f199cc7dd534c2d803da776031", "rates.csv": "fc9b67d63c7eb0091aec2a98a7e77f112eeb004e96d57262ba62515d1eba14a0"}
EXPECTED_ROWS = [["E301", "1423.74"], ["E302", "188.81"], ["E303", "359.18"], ["E304", "379.45"], ["E305", "1946.09"], ["E306", "555.63"], ["E307", "817.31"], ["E308", "345.03"], ["E309", "251.06"], ["E310", "2270.12"], ["E311", "1066.49"], ["E312", "157.66"], ["E313", "2061.95"], ["E314", "108.16"], ["E315", "1794.54"], ["E316", "514.52"], ["E317", "397.75"], ["E318", "283.65"], ["E319", "108.60"], ["E320", "544.10"], ["E321", "1698.52"], ["E322", "2552.30"], ["E323", "1244.34"], ["E324", "306.33"], ["E325", "145.51"], ["E326", "1630.63"], ["E327", "346.42"], ["E328", "2015.25"], ["E329", "710.15"], ["E330", "18.98"]]
EXPECTED_TOTALS = [["Berger", "7004.07"], ["Costa", "3270.11"], ["Dubois", "8538.37"], ["Nakamura", "2733.26"], ["Okafor", "4696.46"]]
checks = {"inputs_unchanged": all(sha256(WS / k) == v for k, v in ORIGINAL.items())}
# one cent of slack: a float-based conversion may round a half cent the other way
res = compare_rows(WS / "expenses_eur.csv", ["id", "amount_eur"], EXPECTED_ROWS, numeric_cols={1}, tol=Decimal("0.01"))
checks.update({"expenses_header": res["header"], "expenses_converted": res["rows"], "expenses_in_input_order": res["order"]})
res = compare_rows(WS / "totals_eur.csv", ["employee", "total_eur"], EXPECTED_TOTALS, numeric_cols={1},
                   tol=Decimal("0.03"))
checks.update({"totals_header": res["header"], "totals_correct": res["rows"], "totals_sorted": res["order"]})
finish(checks, guards=("inputs_unchanged",))
PY
