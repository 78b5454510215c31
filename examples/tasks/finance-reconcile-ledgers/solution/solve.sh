#!/usr/bin/env bash
# Reference solution for finance-reconcile-ledgers (bash + python3 stdlib). Idempotent: running it twice leaves the same result.
set -euo pipefail
cd "${OPENFORGE_WORKSPACE:-/workspace}"
python3 - <<'PY'
import csv
from decimal import Decimal
def load(path, key="amount"):
    with open(path, newline="") as fh:
        return {r["reference"].strip(): Decimal(r[key].replace(",", "").strip()) for r in csv.DictReader(fh)}
bank, ledger = load("bank.csv"), load("ledger.csv")
rows = []
for ref in sorted(set(bank) | set(ledger)):
    b, l = bank.get(ref), ledger.get(ref)
    if b is None:
        rows.append([ref, "", f"{l:.2f}", "missing_in_bank"])
    elif l is None:
        rows.append([ref, f"{b:.2f}", "", "missing_in_ledger"])
    elif b != l:
        rows.append([ref, f"{b:.2f}", f"{l:.2f}", "amount_mismatch"])
with open("reconciliation.csv", "w", newline="") as fh:
    w = csv.writer(fh, lineterminator="\n")
    w.writerow(["reference", "bank_amount", "ledger_amount", "status"])
    w.writerows(rows)
PY
cat reconciliation.csv
