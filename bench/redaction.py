"""Redaction cost: ``proxy._redaction.Redactor.apply`` on what the proxy stores per call.

Inputs: an 8 KB prose prompt (no rule's trigger in it: the common case, which the literal pre-scan keeps cheap),
8 KB of this repository's Python source as a tool result (code carries ``@``, ``//``, ``=``, ``_key`` and the like:
triggers that make some patterns run), the same prose with one secret of every shape in it, and, where the shared
harness captures sit beside the checkout, the tool schemas Claude Code sends with every call (~74 KB). Each is
redacted with the default rule set (``Settings().proxy_redact``) and with every rule, fresh copies per run (the
proxy redacts each new message once). Prints microseconds per call (median of rounds), then as its LAST line one
JSON object ``{"<input>/<rules>": us, ...}``.

Usage: python bench/redaction.py [--rounds N]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forge_store import Settings  # noqa: E402
from proxy._redaction import RULES, Redactor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CAPTURES = ROOT.parent / "shared" / "fixtures" / "harness-requests"
SECRETS = [
    "sk-proj-" + "x" * 40, "AKIA" + "ABCDEFGHIJKLMNOP", "ghp_" + "a" * 36, "Bearer " + "t" * 30,
    "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz12345678",
    "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "postgresql://app:hunter2-s3cret@db.internal:5432/app", "someone@example.com",
]


def inputs() -> dict[str, object]:
    prose = "lorem ipsum dolor sit amet " * 300
    code = "".join(p.read_text() for p in sorted((ROOT / "proxy").glob("*.py")))[:8192]
    out: dict[str, object] = {
        "prose_8k": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": prose}],
        "code_8k": [{"role": "tool", "tool_call_id": "call_1", "content": code}],
        "secrets_8k": [{"role": "user", "content": prose[: 8192 - 600] + " ".join(SECRETS)}],
    }
    capture = CAPTURES / "claude-code-2.1.197.jsonl"
    if capture.exists():
        for line in capture.read_text().splitlines():
            c = json.loads(line) if line.strip() else {}
            if c.get("method") == "POST" and c["body"].get("tools"):
                out["claude_tools_74k"] = c["body"]["tools"]
                break
    return out


def time_us(redactor: Redactor, value: object, rounds: int) -> float:
    per_round = []
    n = 200
    for _ in range(rounds):
        copies = [copy.deepcopy(value) for _ in range(n)]
        t = time.perf_counter()
        for v in copies:
            redactor.apply(v, set())
        per_round.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(per_round)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rule_sets = {"default": list(Settings().proxy_redact), "all": list(RULES)}
    result = {}
    print(f"default rules: {', '.join(rule_sets['default'])}")
    print(f"{'input':<20} {'rules':<8} {'us/call':>9}")
    for name, value in inputs().items():
        for label, rules in rule_sets.items():
            us = time_us(Redactor(rules), value, args.rounds)
            result[f"{name}/{label}"] = round(us, 1)
            print(f"{name:<20} {label:<8} {us:>9.1f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
