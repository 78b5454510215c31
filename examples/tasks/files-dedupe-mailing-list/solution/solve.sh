#!/usr/bin/env bash
# Reference solution for files-dedupe-mailing-list (bash + python3 stdlib). Idempotent: running it twice leaves the same result.
set -euo pipefail
cd "${OPENFORGE_WORKSPACE:-/workspace}"
python3 - <<'PY'
gone = {l.strip().lower() for l in open("unsubscribed.txt") if l.strip()}
out, seen = [], set()
for line in open("subscribers.txt"):
    e = line.strip().lower()
    if not e or e.startswith("#") or e.count("@") != 1:
        continue
    local, domain = e.split("@")
    if not local or "." not in domain or e in gone or e in seen:
        continue
    seen.add(e)
    out.append(e)
with open("subscribers_clean.txt", "w") as fh:
    fh.write("\n".join(out) + "\n")
PY
wc -l subscribers_clean.txt
