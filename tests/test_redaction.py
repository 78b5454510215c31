"""Redaction: the literal prefilter in front of each rule never changes what the rule's pattern alone would do."""

from __future__ import annotations

import dataclasses
import random

import pytest

from proxy._redaction import RULES, Redactor

SECRETS = [
    "sk-" + "A1b2C3d4E5f6G7h8I9j0K",
    "sk-proj-" + "x" * 30,
    "sk-ant-api03-" + "Z9" * 12,
    "AKIA" + "ABCDEFGHIJKLMNOP",
    "ghp_" + "a" * 36, "gho_" + "B" * 40, "ghs_" + "9" * 36,
    "xoxb-" + "1234567890-abc", "xoxp-" + "q" * 12,
    "AIza" + "S" * 35,
    "Bearer abcdefghijklmnop.qrs", "BEARER " + "t" * 20, "bEaReR\t" + "u" * 16,
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
    "-----BEGIN PRIVATE KEY-----abc-----END PRIVATE KEY-----",
    "someone@example.com", "a.b+c@mail.example.org",
    "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "rk_live_" + "Z" * 24, "sk_test_" + "a1" * 12, "whsec_" + "w" * 32,
    "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz12345678",
    "aws_secret_access_key = " + "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", '"SecretAccessKey": "' + "k" * 40 + '"',
    "AWS_SESSION_TOKEN=" + "F" * 120, "AccountKey=" + "a" * 86 + "==", "SharedAccessKey=" + "s" * 44,
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "postgresql://app:hunter2@db:5432/app", "mongodb+srv://u:p%40ss@cluster0.example.net/?x=1",
    "redis://:pw@cache", "https://user:pass@example.com/", "amqp://guest:guest@mq//",
    "ofr1." + "cjE" + ".0." + "S" * 32, "ofr1." + "bXktcm9sbG91dA" + ".1795975971." + "x_-" * 10 + "ab",
    "-----BEGIN PRIVATE KEY-----\\n" + "M" * 64 + "\\n" + "I" * 20,  # a JSON-escaped key cut short of its END
    "-----BEGIN PGP PRIVATE KEY BLOCK-----x-----END PGP PRIVATE KEY BLOCK-----",
    # the shortest match of each rule (rules skip strings shorter than that)
    "xoxb-" + "1" * 10, "AKIA" + "A" * 16, "bearer " + "b" * 16, "a@b.cd",
    "-----BEGIN PRIVATE KEY----------END PRIVATE KEY-----", "AccountKey=" + "A" * 20, "://:p@",
    "eyJ" + "a" * 8 + ".eyJ" + "b" * 8 + ".", "ofr1..0." + "s" * 32,
]
NEAR_MISSES = ["sk-short", "ask-" + "a" * 25, "AKIAlower", "ghx_" + "a" * 36, "xoxz-" + "1" * 12, "bearer short",
               "-----BEGIN PUBLIC KEY-----x-----END PUBLIC KEY-----", "user@localhost", "@", "gh", "sk", "xox",
               "x" + "AIza" + "S" * 35, "_sk-" + "A" * 22, "lorem ipsum dolor sit amet",
               "pk_live_" + "p" * 24, "task_test_" + "a" * 20, "hf_hub_download", "eyJhbGciOiJIUzI1NiJ9",
               "aws_secret_access_key = " + "a" * 39, "https://example.com/a:b@c", "http://localhost:8080/",
               "ofr1.abc", "-----BEGIN PRIVATE KEY-----\n-----", "git@github.com:o/r.git", "ssh://git@host:22/r"]


def naive(rules: list[str], text: str) -> tuple[str, set[str]]:
    hits = set()
    for name in rules:
        if RULES[name].pattern.search(text):
            text = RULES[name].redact(name, text)
            hits.add(name)
    return text, hits


@pytest.mark.parametrize("seed", range(20))
def test_prefilter_agrees_with_the_patterns(seed):
    rng = random.Random(seed)
    names = list(RULES)
    redactor = Redactor(names)
    filler = "lorem ipsum dolor sit amet, consectetur_adipiscing-elit; x = y(z) # " * 20
    for _ in range(50):
        parts = [filler[rng.randrange(len(filler)):][: rng.randrange(200)]]
        for _ in range(rng.randrange(4)):
            parts.append(rng.choice(SECRETS + NEAR_MISSES))
            parts.append(rng.choice([" ", "\n", "-", "_", "", ".", "x", "=", "/"]))
        text = "".join(parts)
        hits: set[str] = set()
        assert (redactor.apply(text, hits), hits) == naive(names, text), text


@pytest.mark.parametrize("secret", SECRETS)
def test_every_rule_fires_on_its_secrets(secret):
    hits: set[str] = set()
    out = Redactor(list(RULES)).apply({"messages": [{"content": f"use {secret} now"}]}, hits)
    assert hits and "[REDACTED:" in out["messages"][0]["content"]
    assert secret not in out["messages"][0]["content"]
    alone: set[str] = set()  # the secret as a whole string: exactly as long as a rule's shortest match, or longer
    assert Redactor(list(RULES)).apply(secret, alone) != secret and alone == hits


def test_the_prefilter_skips_the_patterns_on_text_without_triggers(monkeypatch):
    """The point of the prefilter: on ordinary text no pattern runs at all."""
    calls = []

    class Spy:
        def __init__(self, rx):
            self.rx, self.groups = rx, rx.groups

        def search(self, text):
            calls.append(self.rx.pattern)
            return self.rx.search(text)

        def sub(self, *args):
            return self.rx.sub(*args)

    redactor = Redactor(list(RULES))
    redactor.rules = [(n, dataclasses.replace(r, pattern=Spy(r.pattern))) for n, r in redactor.rules]
    hits: set[str] = set()
    redactor.apply("lorem ipsum dolor sit amet " * 300, hits)
    assert calls == [] and hits == set()
    redactor.apply("mail me at someone@example.com", hits)  # "@": the two rules whose trigger it is run
    assert sorted(calls) == sorted(RULES[n].pattern.pattern for n in ("emails", "url_passwords"))
    assert hits == {"emails"}


def test_a_memo_scans_each_distinct_string_once_and_gives_the_same_result(monkeypatch):
    """The proxy redacts an answer's text twice over (the response's text and its message's content) with one memo:
    the second copy is not scanned again, and comes out redacted the same, its rules reported."""
    scans = []
    redactor = Redactor(list(RULES))
    real = Redactor.apply

    def counting(self, value, hits, memo=None):
        if isinstance(value, str) and (memo is None or value not in memo) and len(value) >= self._min_len:
            scans.append(value)
        return real(self, value, hits, memo)

    monkeypatch.setattr(Redactor, "apply", counting)
    text = "reach me at someone@example.com, not at the office"
    memo: dict = {}
    first, second = set(), set()
    a = redactor.apply({"text": text, "tool_calls": None}, first, memo)
    b = redactor.apply({"role": "assistant", "content": text}, second, memo)
    assert a["text"] == b["content"] == redactor.apply(text, set()) and "someone@example.com" not in a["text"]
    assert first == second == {"emails"} and scans.count(text) == 2   # once with the memo, once without
