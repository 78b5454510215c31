"""Where the token view's text comes from: the store keeps token ids and logprobs, never a tokenizer.

Token ids are the ground truth (DESIGN, invariant 2); text is only a reading aid, so a wrong tokenizer is worse than
none: it would show plausible words that the policy never produced. In order:

1. **A tokenizer for the policy version**: ``tokenizer.json`` (the ``tokenizers`` library, which reads every Hugging
   Face fast tokenizer without ``transformers``) in the version's checkpoint folder (``checkpoint_id``), else in an
   ancestor's along ``metadata.parent`` (``openforge train`` copies its base's tokenizer unchanged into every
   checkpoint), else in the engine's model folder when the version's ``model_name`` is a local folder (vLLM serves
   a folder under its path). A folder the user names on the page comes first. Each candidate must pass
   :func:`check` on the segment: the version's recorded ``tokenizer_hash`` (when there is one) equals the file's
   sha256, the vocabulary covers every id, and the engine's own answer text (or its tool-call names) and the first
   prompt message appear in the decoded ids. A candidate that fails is named with why, never used.
2. **Text the engine recorded per token**: an OpenAI-shaped ``logprobs.content[].token`` in a call's stored
   response (a client of ``Store.record_call`` may keep it; the proxy records ids and logprobs only), for that
   call's completion tokens only.
3. **Ids only**, and the page says why.

Tokenizers are cached per file (path, size and mtime), so a page rerun does not parse a 2-17 MB JSON again.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from forge_store import Store, TimelineCall

FILE = "tokenizer.json"


@dataclass
class TokenText:
    """How token ids become text for one segment: ``tokenizer`` (None: engine text or ids only) and what the page
    says about it (``source``: where it came from; ``rejected``: candidates that failed a check, with why)."""

    tokenizer: Tokenizer | None
    source: str
    rejected: list[str] = field(default_factory=list)
    checked: str = ""

    def texts(self, ids: list[int]) -> list[str] | None:
        """Each token decoded alone, as an engine reports it in logprobs (a partial UTF-8 character shows as U+FFFD)."""
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)


@functools.lru_cache(maxsize=8)
def _load(path: str, size: int, mtime_ns: int) -> tuple[Tokenizer, str]:
    data = Path(path).read_bytes()
    return Tokenizer.from_str(data.decode("utf-8")), hashlib.sha256(data).hexdigest()


def load(folder: Path) -> tuple[Tokenizer, str]:
    """The tokenizer in ``folder`` and the sha256 of its ``tokenizer.json`` (cached while the file is unchanged)."""
    f = folder / FILE
    st = f.stat()
    return _load(str(f.resolve()), st.st_size, st.st_mtime_ns)


def candidates(store: Store, version_id: str | None) -> list[tuple[Path, str, str | None]]:
    """Folders that may hold the tokenizer of ``version_id``: (folder, why, the tokenizer_hash recorded for it)."""
    rows = {r["id"]: r for r in store.lineage("policy_versions")}
    out, seen, vid = [], set(), version_id
    while vid in rows and vid not in seen:
        seen.add(vid)
        row = rows[vid]
        own = vid == version_id
        for value, why in ((row.get("checkpoint_id"), "the checkpoint folder of " +
                            (f"policy version {vid}" if own else f"its ancestor {vid} (training keeps the tokenizer)")),
                           (row.get("model_name"), f"the engine's model folder of {vid}")):
            if value and Path(value).is_dir() and (Path(value) / FILE).is_file():
                out.append((Path(value), why, row.get("tokenizer_hash")))
        vid = (row.get("metadata") or {}).get("parent")
    return out


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def check(tok: Tokenizer, ids: list[int], answers: list[tuple], first_prompt: tuple | None,
          most: int = 20) -> tuple[str | None, str]:
    """Whether ``tok`` is the tokenizer these ids came from: (the problem or None, what was checked). ``answers``:
    each call's (id, completion ids, the engine's answer text, its tool-call names), of which the first ``most``
    with text are decoded; ``first_prompt``: (the prompt's ids, its first message's text) or None."""
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if ids and max(ids) >= vocab:
        return f"the segment holds token id {max(ids)}, past its vocabulary of {vocab}", ""
    checked = 0
    for cid, completion, answer, names in answers:
        answer = _squash(answer or "")
        if checked >= most or not completion or not (answer or any(names)):
            continue
        decoded = _squash(tok.decode(completion, skip_special_tokens=True))
        missing = (answer if answer and answer[:200] not in decoded
                   else next((n for n in names if n not in decoded), None))
        if missing:
            return (f"call {cid}'s completion ids decode to {decoded[:80]!r}, but the engine answered "
                    f"{missing[:80]!r}"), ""
        checked += 1
    if first_prompt is not None and first_prompt[0] and _squash(first_prompt[1]):
        head = _squash(first_prompt[1])[:200]
        if head not in _squash(tok.decode(first_prompt[0], skip_special_tokens=False)):
            return f"the first prompt's ids do not decode to its first message ({head[:60]!r})", ""
        checked += 1
    what = (f"{len(ids):,} ids within its vocabulary of {vocab:,}; {checked} decoded text(s) match the engine's "
            "answers and the first prompt message") if checked else \
        f"{len(ids):,} ids within its vocabulary of {vocab:,} (no answer text to compare: unverified beyond that)"
    return None, what


def resolve(store: Store, version_id: str | None, ids: list[int], answers: list[tuple], first_prompt: tuple | None,
            folder: str | None = None) -> TokenText:
    """The first candidate tokenizer that passes :func:`check` on one segment, else none, saying why."""
    found = [(Path(folder), "the folder named on this page", None)] if folder else []
    rejected = []
    for path, why, recorded in found + candidates(store, version_id):
        if not (path / FILE).is_file():
            rejected.append(f"{path}: no {FILE} there")
            continue
        try:
            tok, sha = load(path)
        except Exception as exc:  # tokenizers raises a bare Exception for a file it cannot parse: name it, go on
            rejected.append(f"{path}: cannot load {FILE} ({type(exc).__name__}: {str(exc)[:120]})")
            continue
        if recorded and recorded != sha:
            rejected.append(f"{path} ({why}): sha256 {sha[:12]} but the version records tokenizer {recorded[:12]}")
            continue
        problem, what = check(tok, ids, answers, first_prompt)
        if problem:
            rejected.append(f"{path} ({why}): {problem}")
            continue
        return TokenText(tok, f"{path / FILE} ({why})", rejected, what)
    version = f"policy version {version_id}" if version_id else "these calls (no policy version)"
    return TokenText(None, f"no tokenizer found for {version} that matches its ids", rejected)


def engine_texts(call: TimelineCall) -> list[str] | None:
    """The engine's own text of each completion token, when the stored response carries it (OpenAI's
    ``logprobs.content[].token``, one per completion id); None otherwise."""
    lp = (call.response or {}).get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if not isinstance(content, list) or len(content) != (call.n_completion_tokens or 0):
        return None
    texts = [t.get("token") if isinstance(t, dict) else None for t in content]
    return texts if all(isinstance(t, str) for t in texts) else None
