#!/usr/bin/env bash
# Reference solution for finance-category-totals (bash + python3 stdlib). Idempotent: running it twice leaves the same result.
set -euo pipefail
cd "${OPENFORGE_WORKSPACE:-/workspace}"
python3 - <<'PY'
import csv
from decimal import Decimal
tot, cnt = {}, {}
with open("transactions.csv", newline="") as fh:
    for row in csv.DictReader(fh):
        if row["status"].strip() != "posted":
            continue
        c = row["category"].strip().lower()
        tot[c] = tot.get(c, Decimal(0)) + Decimal(row["amount"])
        cnt[c] = cnt.get(c, 0) + 1
with open("category_totals.csv", "w", newline="") as fh:
    w = csv.writer(fh, lineterminator="\n")
    w.writerow(["category", "total", "count"])
    for c in sorted(tot, key=lambda c: (-tot[c], c)):
        w.writerow([c, f"{tot[c]:.2f}", cnt[c]])
PY
cat category_totals.csv
