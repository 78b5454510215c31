#!/usr/bin/env bash
# Reference solution for files-organise-by-date (bash + python3 stdlib). Idempotent: running it twice leaves the same result.
set -euo pipefail
cd "${OPENFORGE_WORKSPACE:-/workspace}"
python3 - <<'PY'
import datetime, os, re, shutil
from pathlib import Path
inbox = Path("inbox")
for p in sorted(inbox.iterdir()) if inbox.is_dir() else []:
    if not p.is_file():
        continue
    target = "undated"
    m = re.search(r"(\d{4})-(\d{2})-(\d{2})", p.name)
    if m:
        try:
            datetime.date(int(m[1]), int(m[2]), int(m[3]))
            target = f"{m[1]}/{m[2]}"
        except ValueError:
            pass
    dest = Path("archive") / target
    dest.mkdir(parents=True, exist_ok=True)
    shutil.move(str(p), str(dest / p.name))
PY
rmdir inbox 2>/dev/null || true
