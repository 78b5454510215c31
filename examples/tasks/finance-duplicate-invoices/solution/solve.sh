#!/usr/bin/env bash
# Reference solution for finance-duplicate-invoices (bash + python3 stdlib). Idempotent: running it twice leaves the same result.
set -euo pipefail
cd "${OPENFORGE_WORKSPACE:-/workspace}"
python3 - <<'PY'
import csv
from decimal import Decimal
def key(row):
    n = row["invoice_number"].strip().upper()
    for prefix in ("INV-", "INV"):
        if n.startswith(prefix):
            n = n[len(prefix):]
            break
    return (" ".join(row["vendor"].split()).lower(), n.lstrip("0") or "0", Decimal(row["amount"]))
seen, out = {}, []
with open("invoices.csv", newline="") as fh:
    for row in csv.DictReader(fh):
        k = key(row)
        if k in seen:
            out.append([row["row_id"], seen[k]])
        else:
            seen[k] = row["row_id"]
with open("duplicates.csv", "w", newline="") as fh:
    w = csv.writer(fh, lineterminator="\n")
    w.writerow(["duplicate_row_id", "original_row_id"])
    w.writerows(out)
PY
cat duplicates.csv
