#!/usr/bin/env bash
# Reference solution for files-fix-inventory-script (bash + python3 stdlib). Idempotent: running it twice leaves the same result.
set -euo pipefail
cd "${OPENFORGE_WORKSPACE:-/workspace}"
cat > inventory.py <<'EOF'
"""Print a stock valuation report for an inventory CSV.

Usage: python3 inventory.py [INVENTORY_CSV]     (default: inventory.csv in the current directory)

The CSV has a header row `sku,name,quantity,unit_price`. An empty quantity means 0. Every row is an item.

Output, one line per item, sorted by stock value (quantity * unit_price) from highest to lowest, ties by sku:

    <sku padded to 8> <name padded to 24> <quantity right-aligned in 5> x <unit price, 2 decimals, width 8> = <value, 2 decimals, width 10>

then a blank line, then

    ITEMS: <number of items>
    UNITS: <sum of quantities>
    TOTAL VALUE: <sum of values, 2 decimals>
"""

import csv
import sys


def load(path):
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    items = []
    for sku, name, qty, price in rows[1:]:
        items.append({"sku": sku, "name": name, "qty": int(qty) if qty.strip() else 0, "price": float(price)})
    return items


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "inventory.csv"
    items = load(path)
    for it in items:
        it["value"] = it["qty"] * it["price"]
    items.sort(key=lambda it: (-it["value"], it["sku"]))
    for it in items:
        print(f"{it['sku']:<8} {it['name']:<24} {it['qty']:>5} x {it['price']:>8.2f} = {it['value']:>10.2f}")
    print()
    print(f"ITEMS: {len(items)}")
    print(f"UNITS: {sum(it['qty'] for it in items)}")
    print(f"TOTAL VALUE: {sum(it['value'] for it in items):.2f}")


if __name__ == "__main__":
    main()
EOF
python3 inventory.py inventory.csv
