"""Field-level redaction of everything the proxy stores (never of what it forwards).

Rules are named regular expressions, chosen by configuration (``OPENFORGE_PROXY_REDACT``). Each match becomes
``[REDACTED:<rule>]`` (a rule that keys on a name, ``AccountKey=`` or a URL's ``user:``, keeps that context and
replaces only the secret after it); the call's metadata lists which rules fired (``redacted``). Token ids are not
redacted (they are the engine's ground truth and cannot be edited without re-tokenizing): the learner's exports
leave out calls whose metadata says a rule fired.

What the rules leave alone on purpose, so that ordinary agent traffic is stored as sent: hex digests (sha256, git
shas), uuids, base64 payloads (a ``data:`` URL's image is in the blob store before any rule runs; and no rule's
shape fits inside a base64 run: ``-``, ``_``, ``.``, ``:`` and ``@`` are not in its alphabet), publishable keys
(Stripe ``pk_``, public by design) and URLs without a password. A bare 40-character AWS secret access key looks
like any other base64 or hex string: it is caught only next to its name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._auth import PREFIX as _TOKEN_PREFIX


@dataclass(frozen=True)
class Rule:
    """A pattern, and ``triggers``: literal text (or a pattern that starts with a literal) of which every string
    the pattern matches in contains at least one, compared case-folded with ``fold``. A literal is found by a fast
    scan (~1 us per KB), so the pattern runs only on text where a trigger occurs; and the patterns start with a
    literal (a word boundary is a look-behind after it, not a leading ``\\b``), so that when one does run it too
    is a scan for that literal (a leading ``\\b`` or ``(?i)`` is tried at every position: ~20 us per KB).

    A pattern with a capturing group (one per alternative) replaces only what that group matched: the rest of the
    match (a name, a URL's user) is context that stays."""

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

    def redact(self, name: str, value: str) -> str:
        """``value`` with every match (or the match's group) replaced by ``[REDACTED:<name>]``."""
        tag = f"[REDACTED:{name}]"
        if not self.pattern.groups:
            return self.pattern.sub(tag, value)

        def one(m: re.Match) -> str:
            g, at = m.lastindex, m.start()
            return tag if g is None else m[0][: m.start(g) - at] + tag + m[0][m.end(g) - at:]

        return self.pattern.sub(one, value)


def _word(literal: str) -> str:
    """``literal`` at the start of a word: ``\\b<literal>``, spelled so that the pattern starts with the literal."""
    return f"{literal}(?<!\\w{literal})"


_B64URL = "[A-Za-z0-9_-]"
_NAME_SEP = r"""["']?\s*[:=]\s*["']?"""  # name = value, name: "value", "name": "value"

RULES: dict[str, Rule] = {
    # By prefix: OpenAI / Anthropic, AWS access key ids, GitHub, Slack, Google, Stripe secret and restricted keys
    # (live and test: a test key still reads the account's test data) and webhook secrets, Hugging Face tokens.
    "api_keys": Rule(re.compile(
        f"{_word('sk-')}(?:proj-|ant-)?[A-Za-z0-9_-]{{20,}}|{_word('AKIA')}[0-9A-Z]{{16}}"
        f"|{_word('gh[pousr]_')}[A-Za-z0-9]{{36,}}|{_word('xox[abpr]-')}[A-Za-z0-9-]{{10,}}"
        f"|{_word('AIza')}[0-9A-Za-z_-]{{35}}"
        f"|{_word('sk_')}(?:live|test)_[A-Za-z0-9]{{16,}}|{_word('rk_')}(?:live|test)_[A-Za-z0-9]{{16,}}"
        f"|{_word('whsec_')}[A-Za-z0-9]{{24,}}|{_word('hf_')}[A-Za-z0-9]{{30,}}"
    ), ("sk-", "AKIA", "AIza", "xox", re.compile(r"gh[pousr]_"), "k_live_", "k_test_", "whsec_", "hf_"), min_len=14),
    "bearer_tokens": Rule(re.compile(r"[Bb](?<!\w[Bb])(?i:earer)\s+[A-Za-z0-9._~+/=-]{16,}"), ("bearer",),
                          min_len=23, fold=True),
    # PEM private keys (GCP service-account JSON's "private_key" is one, its newlines escaped), also cut short of
    # their END line (a truncated tool output) when a body follows the header.
    "private_keys": Rule(re.compile(
        r"-----BEGIN [A-Z ]*PRIVATE KEY(?: BLOCK)?-----(?:.*?-----END [A-Z ]*PRIVATE KEY(?: BLOCK)?-----"
        r"|(?:\s|\\[nr])+[A-Za-z0-9+/]{40}(?:[A-Za-z0-9+/=\s]|\\[nr])*)", re.S),
        ("-----BEGIN ",), min_len=52),
    # Next to their names (any case): AWS secret access keys (exactly 40 base64 characters) and session tokens,
    # Azure connection strings' AccountKey= / SharedAccessKey=. The first letter leads, outside (?i), so that the
    # pattern is a scan for four letters rather than an attempt at every position (~50 us per 8 KB, not ~1 ms).
    "cloud_keys": Rule(re.compile(
        rf"(?a)[SsAa](?:(?i:ecret[_-]?access[_-]?key){_NAME_SEP}([A-Za-z0-9/+]{{40}})(?![A-Za-z0-9/+=])"
        rf"|(?i:ession[_-]?token){_NAME_SEP}([A-Za-z0-9/+=]{{100,}})"
        r"|(?i:ccountkey=|haredaccesskey=)([A-Za-z0-9+/]{20,}={0,2}))"
    ), (re.compile(r"secret[_-]?access[_-]?key"), re.compile(r"session[_-]?token"), "accountkey=",
        "sharedaccesskey="), min_len=31, fold=True),
    # JSON Web Tokens: a JSON header and payload ("{" is "eyJ" in base64url) and a signature (empty if unsigned).
    "jwts": Rule(re.compile(f"{_word('eyJ')}{_B64URL}{{8,}}\\.eyJ{_B64URL}{{8,}}\\.{_B64URL}*"), ("eyJ",),
                 min_len=24),
    # The password of any scheme://user:password@host (postgresql, mysql, redis, amqp, mongodb+srv, https, ...):
    # user and host stay. The password runs to the last "@" before the host's "/", "?", "#" or a space or quote.
    "url_passwords": Rule(re.compile(r"""://[^\s:/?#@"'<>\\]*:([^\s/?#"'<>\\]+)@"""), ("@",), min_len=6),
    # The proxy's own rollout tokens (proxy._auth), which harnesses carry as their API key.
    "rollout_tokens": Rule(re.compile(f"{_word(re.escape(_TOKEN_PREFIX + '.'))}{_B64URL}*\\.[0-9]+\\.{_B64URL}{{32}}"),
                           (_TOKEN_PREFIX + ".",), min_len=len(_TOKEN_PREFIX) + 36),
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

    def apply(self, value, hits: set[str], memo: dict[str, tuple[str, frozenset]] | None = None):
        """``value`` with every match replaced (a copy only where something changed); rule names go into ``hits``.
        ``memo``, shared by the calls that store one record, scans each distinct string once (an answer's text is
        both the response's ``text`` and its message's ``content``)."""
        if not self.rules:
            return value
        if isinstance(value, str):
            if len(value) < self._min_len:
                return value
            if memo is not None and value in memo:
                out, fired = memo[value]
                hits.update(fired)
                return out
            original, folded, fired = value, (value.lower() if self._fold else None), set()
            for name, rule in self.rules:
                if rule.may_match(value, folded) and rule.pattern.search(value):
                    value = rule.redact(name, value)
                    fired.add(name)
            hits.update(fired)
            if memo is not None:
                memo[original] = (value, frozenset(fired))
            return value
        if isinstance(value, dict):
            out = None
            for k, v in value.items():
                nv = self.apply(v, hits, memo)
                if nv is not v:
                    out = out if out is not None else dict(value)
                    out[k] = nv
            return value if out is None else out
        if isinstance(value, list):
            out = None
            for i, v in enumerate(value):
                nv = self.apply(v, hits, memo)
                if nv is not v:
                    out = out if out is not None else list(value)
                    out[i] = nv
            return value if out is None else out
        return value
