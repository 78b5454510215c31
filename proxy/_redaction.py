"""Field-level redaction of everything the proxy stores (never of what it forwards).

Rules are named regular expressions, chosen by configuration (``OPENFORGE_PROXY_REDACT``). Each match becomes
``[REDACTED:<rule>]``; the call's metadata lists which rules fired. Token ids are not redacted (they are the
engine's ground truth and cannot be edited without re-tokenizing): the learner can exclude calls whose metadata
says a rule fired.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """A pattern, and ``triggers``: literal text (or a pattern that starts with a literal) of which every match
    contains at least one, compared case-folded with ``fold``. A pattern that starts with ``\\b`` or ``(?i)`` is
    tried at every position of a string (the default rules together took ~320 us on an 8 KB prompt); a literal is
    found by a fast scan (~4 us per 8 KB), so the pattern runs only on text where a trigger occurs."""

    pattern: re.Pattern
    triggers: tuple[str | re.Pattern, ...]
    min_len: int  # no match is shorter: shorter strings (roles, model names) are skipped outright
    fold: bool = False

    def may_match(self, value: str, folded: str | None) -> bool:
        if len(value) < self.min_len:
            return False
        text = folded if self.fold else value
        for t in self.triggers:
            if (t in text) if isinstance(t, str) else t.search(text):
                return True
        return False


RULES: dict[str, Rule] = {
    "api_keys": Rule(re.compile(
        r"\b(?:sk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{36,}|xox[abpr]-[A-Za-z0-9-]{10,}"
        r"|AIza[0-9A-Za-z_-]{35})"
    ), ("sk-", "AKIA", "AIza", "xox", re.compile(r"gh[pousr]_")), min_len=14),
    "bearer_tokens": Rule(re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{16,}"), ("bearer",), min_len=23, fold=True),
    "private_keys": Rule(re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
                         ("-----BEGIN ",), min_len=52),
    "emails": Rule(re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b"), ("@",), min_len=6),
}


class Redactor:
    def __init__(self, rule_names: list[str]):
        unknown = [n for n in rule_names if n not in RULES]
        if unknown:
            raise ValueError(f"redaction rule(s) {unknown} unknown: choose from {', '.join(RULES)}")
        self.rules = [(n, RULES[n]) for n in rule_names]
        self._fold = any(RULES[n].fold for n in rule_names)
        self._min_len = min((RULES[n].min_len for n in rule_names), default=0)

    def apply(self, value, hits: set[str]):
        """``value`` with every match replaced (a copy only where something changed); rule names go into ``hits``."""
        if not self.rules:
            return value
        if isinstance(value, str):
            if len(value) < self._min_len:
                return value
            folded = value.lower() if self._fold else None
            for name, rule in self.rules:
                if rule.may_match(value, folded) and rule.pattern.search(value):
                    value = rule.pattern.sub(f"[REDACTED:{name}]", value)
                    hits.add(name)
            return value
        if isinstance(value, dict):
            out = None
            for k, v in value.items():
                nv = self.apply(v, hits)
                if nv is not v:
                    out = out if out is not None else dict(value)
                    out[k] = nv
            return value if out is None else out
        if isinstance(value, list):
            out = None
            for i, v in enumerate(value):
                nv = self.apply(v, hits)
                if nv is not v:
                    out = out if out is not None else list(value)
                    out[i] = nv
            return value if out is None else out
        return value
