#!/usr/bin/env bash
# Reference solution for helpdesk-close-stale-pending (bash + python3 stdlib). Idempotent: running it twice leaves the same result.
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
from datetime import datetime, timedelta
ts = lambda s: datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ")
now = ts(call("GET", "/meta")["now"])
for t in all_tickets("status=pending"):
    if "vip" in t["tags"] or ts(t["updated_at"]) >= now - timedelta(days=7):
        continue
    call("POST", f"/tickets/{t['id']}/comments",
         {"body": "Closed due to inactivity. Reply to this e-mail to reopen the ticket.", "public": True})
    call("PATCH", f"/tickets/{t['id']}", {"status": "closed"})
    print("closed", t["id"])
PY
