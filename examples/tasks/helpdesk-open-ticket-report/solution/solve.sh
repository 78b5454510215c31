#!/usr/bin/env bash
# Reference solution for helpdesk-open-ticket-report (bash + python3 stdlib). Idempotent: running it twice leaves the same result.
set -euo pipefail
cd "${OPENFORGE_WORKSPACE:-/workspace}"
python3 - <<'PY'
import json, os, urllib.request
API = f"http://127.0.0.1:{os.environ.get('OPENFORGE_SERVICE_PORT', '8931')}"
def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(API + path, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())
def all_tickets(query=""):
    page, out = 1, []
    while page:
        res = call("GET", f"/tickets?{query}&page={page}")
        out += res["tickets"]
        page = res["next_page"]
    return out
OPEN = ("new", "open", "pending")
open_t = [t for t in all_tickets() if t["status"] in OPEN]
urgent = sorted((t for t in open_t if t["priority"] == "urgent"), key=lambda t: t["created_at"])
report = {
    "total_open": len(open_t),
    "open_by_priority": {p: sum(t["priority"] == p for t in open_t) for p in ("low", "normal", "high", "urgent")},
    "open_by_team": {k: sum(t["team"] == k for t in open_t) for k in ("billing", "shipping", "tech")},
    "oldest_open_urgent": urgent[0]["id"],
    "unassigned_open": sorted(t["id"] for t in open_t if t["assignee"] is None),
}
with open("report.json", "w") as fh:
    json.dump(report, fh, indent=2)
print(json.dumps(report))
PY
