#!/usr/bin/env bash
# Reference solution for finance-monthly-balance (bash + python3 stdlib). Idempotent: running it twice leaves the same result.
set -euo pipefail
cd "${OPENFORGE_WORKSPACE:-/workspace}"
python3 - <<'PY'
import csv, re
from decimal import Decimal
acct = open("account.txt").read()
opening = Decimal(re.search(r"Opening balance on [0-9-]+: ([0-9,.-]+)", acct)[1].replace(",", ""))
start, end = re.search(r"Statement period: (\d{4}-\d{2})-\d{2} to (\d{4}-\d{2})-\d{2}", acct).groups()
months, (y, m) = [], map(int, start.split("-"))
while f"{y:04d}-{m:02d}" <= end:
    months.append(f"{y:04d}-{m:02d}")
    y, m = (y + 1, 1) if m == 12 else (y, m + 1)
inflow = {k: Decimal(0) for k in months}
outflow = {k: Decimal(0) for k in months}
with open("statement.csv", newline="") as fh:
    for r in csv.DictReader(fh):
        a = Decimal(r["amount"])
        (inflow if a > 0 else outflow)[r["date"][:7]] += abs(a)
balance = opening
with open("monthly_balance.csv", "w", newline="") as fh:
    w = csv.writer(fh, lineterminator="\n")
    w.writerow(["month", "inflow", "outflow", "closing_balance"])
    for k in months:
        balance += inflow[k] - outflow[k]
        w.writerow([k, f"{inflow[k]:.2f}", f"{outflow[k]:.2f}", f"{balance:.2f}"])
PY
cat monthly_balance.csv
