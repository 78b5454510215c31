#!/usr/bin/env bash
# Reference solution for files-largest-log-errors (bash + python3 stdlib). Idempotent: running it twice leaves the same result.
set -euo pipefail
cd "${OPENFORGE_WORKSPACE:-/workspace}"
python3 - <<'PY'
import json
from pathlib import Path
logs = sorted(Path("logs").glob("*.log"), key=lambda p: (-p.stat().st_size, p.name))
largest = logs[0]
errors = []
for line in largest.read_text().splitlines():
    parts = line.split(" ", 3)
    if len(parts) >= 3 and parts[1] == "ERROR":
        errors.append(parts)
by = {}
for p in errors:
    c = p[2].strip("[]")
    by[c] = by.get(c, 0) + 1
summary = {"file": largest.name, "total_errors": len(errors), "by_component": dict(sorted(by.items())),
           "first_error_at": errors[0][0], "last_error_at": errors[-1][0]}
Path("error_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary))
PY
