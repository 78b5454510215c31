#!/usr/bin/env bash
# Reference solution for helpdesk-assign-by-load (bash + python3 stdlib). Idempotent: running it twice leaves the same result.
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
agents = call("GET", "/agents")["agents"]
tickets = all_tickets()
load = {a["name"]: 0 for a in agents}
for t in tickets:
    if t["assignee"] and t["status"] in ("new", "open", "pending"):
        load[t["assignee"]] += 1
for t in sorted(tickets, key=lambda t: t["id"]):
    if t["status"] != "new" or t["assignee"] is not None:
        continue
    cands = [a["name"] for a in agents if a["team"] == t["team"] and a["role"] == "agent" and not a["out_of_office"]]
    pick = min(cands, key=lambda n: (load[n], n))
    load[pick] += 1
    call("PATCH", f"/tickets/{t['id']}", {"assignee": pick, "status": "open"})
    print(t["id"], "->", pick)
PY
