#!/usr/bin/env bash
# Reference solution for finance-currency-conversion (bash + python3 stdlib). Idempotent: running it twice leaves the same result.
set -euo pipefail
cd "${OPENFORGE_WORKSPACE:-/workspace}"
python3 - <<'PY'
import csv
from decimal import Decimal, ROUND_HALF_UP
with open("rates.csv", newline="") as fh:
    rates = {(r["month"], r["currency"]): Decimal(r["eur_per_unit"]) for r in csv.DictReader(fh)}
rows, totals = [], {}
with open("expenses.csv", newline="") as fh:
    for r in csv.DictReader(fh):
        rate = Decimal(1) if r["currency"] == "EUR" else rates[(r["date"][:7], r["currency"])]
        eur = (Decimal(r["amount"]) * rate).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
        rows.append([r["id"], f"{eur:.2f}"])
        totals[r["employee"]] = totals.get(r["employee"], Decimal(0)) + eur
with open("expenses_eur.csv", "w", newline="") as fh:
    w = csv.writer(fh, lineterminator="\n")
    w.writerow(["id", "amount_eur"])
    w.writerows(rows)
with open("totals_eur.csv", "w", newline="") as fh:
    w = csv.writer(fh, lineterminator="\n")
    w.writerow(["employee", "total_eur"])
    w.writerows([e, f"{totals[e]:.2f}"] for e in sorted(totals))
PY
cat totals_eur.csv
