#!/usr/bin/env bash
# Reference solution for helpdesk-reply-order-status (bash + python3 stdlib). Idempotent: running it twice leaves the same result.
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
import re
inbox = call("GET", "/mailbox/messages?folder=inbox&unread=true")["messages"]
already = {m["in_reply_to"] for m in call("GET", "/mailbox/messages?folder=sent")["messages"]}
for head in inbox:
    m = call("GET", f"/mailbox/messages/{head['id']}")
    found = re.findall(r"\bA\d{5}\b", m["subject"] + " " + m["body"])
    if not found or not re.search(r"order", m["subject"] + " " + m["body"], re.I):
        continue
    order = call("GET", f"/orders/{found[0]}")
    if m["id"] not in already:
        text = f"Hello,\n\nthank you for your message. Your order {order['id']} is currently {order['status']}."
        if order.get("tracking_number"):
            text += f" It travels with {order['carrier']}, tracking number {order['tracking_number']}."
        text += "\n\nKind regards,\nAcme Shop support"
        call("POST", "/mailbox/messages", {"to": m["from"], "subject": "Re: " + m["subject"], "body": text,
                                           "in_reply_to": m["id"]})
    call("PATCH", f"/mailbox/messages/{m['id']}", {"read": True})
    print("answered", m["id"], order["id"], order["status"])
PY
