#!/usr/bin/env bash
# Reference solution for helpdesk-escalate-sla-breaches (bash + python3 stdlib). Idempotent: running it twice leaves the same result.
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
SLA = {"urgent": 4, "high": 8, "normal": 24, "low": 72}
UP = {"low": "normal", "normal": "high", "high": "urgent", "urgent": "urgent"}
ts = lambda s: datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ")
now = ts(call("GET", "/meta")["now"])
leads = {a["team"]: a["name"] for a in call("GET", "/agents")["agents"] if a["role"] == "lead"}
for head in all_tickets():
    if head["status"] not in ("new", "open") or "sla-breach" in head["tags"]:   # tagged: escalated by an earlier run
        continue
    t = call("GET", f"/tickets/{head['id']}")
    if any(c["author"] == "agent" and c["public"] for c in t["comments"]):
        continue
    if now - ts(t["created_at"]) <= timedelta(hours=SLA[t["priority"]]):
        continue
    call("PATCH", f"/tickets/{t['id']}", {"tags": t["tags"] + ["sla-breach"], "priority": UP[t["priority"]],
                                          "assignee": leads[t["team"]]})
    print("escalated", t["id"])
PY
