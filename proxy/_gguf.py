"""Read a GGUF file's tokenizer metadata and turn it into a Hugging Face `tokenizer.json`.

Only the key/value header is parsed (pure Python, no numpy): the tensors are never touched. The
tokenizer is rebuilt the way llama.cpp runs it, which is also how the model's original
`tokenizer.json` was written: byte-level BPE over the GGUF's tokens and merges, with the
pre-tokenizer that `tokenizer.ggml.pre` names. Where this departs from transformers' own GGUF
converter (5.x): its pre-tokenizer table has no `smollm` / `starcoder` entry, so it falls back to
GPT-2's plain ByteLevel split and drops the individual-digit split those tokenizers use; a
whitespace run before a digit then tokenizes differently ("\\n\\n0": two `Ċ` there, one `ĊĊ` here).
We keep the split: llama.cpp splits `\\p{N}` first for these pre-types, and the original SmolLM2
`tokenizer.json` has `Digits(individual_digits=true)` before `ByteLevel`.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["GGUFError", "read_gguf_metadata", "tokenizer_files_from_gguf"]

_MAGIC = b"GGUF"
# GGUF value types -> struct format (scalars only; 8 = string, 9 = array).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9

# llama.cpp token types
_CONTROL, _USER_DEFINED = 3, 4

_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
_DIGITS_THEN_BYTE_LEVEL = {
    "type": "Sequence",
    "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTE_LEVEL],
}
# tokenizer.ggml.pre -> HF pre_tokenizer. Only families whose llama.cpp regex is exactly
# GPT-2's (optionally after an individual-digit split) are listed; others fail loudly.
_PRE_TOKENIZERS = {
    "default": _BYTE_LEVEL,
    "gpt2": _BYTE_LEVEL,
    "smollm": _DIGITS_THEN_BYTE_LEVEL,
    "starcoder": _DIGITS_THEN_BYTE_LEVEL,
    "refact": _DIGITS_THEN_BYTE_LEVEL,
    "codeshell": _DIGITS_THEN_BYTE_LEVEL,
}


def _post_processor(md: dict[str, Any], tokens: list[str]) -> dict[str, Any]:
    """ByteLevel offsets only, unless the GGUF asks for a BOS token in front of every encoding."""
    bos_id = md.get("tokenizer.ggml.bos_token_id")
    if not md.get("tokenizer.ggml.add_bos_token", False) or bos_id is None:
        return {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    bos = tokens[bos_id]
    return {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": bos, "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }


class GGUFError(ValueError):
    """The file is not a GGUF file, or its tokenizer is of a kind this module cannot rebuild."""


class _Reader:
    def __init__(self, f: BinaryIO, endian: str) -> None:
        self._f = f
        self._e = endian

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        data = self._f.read(size)
        if len(data) != size:
            raise GGUFError("GGUF file ends inside its metadata header; the file is truncated.")
        return struct.unpack(self._e + fmt, data)[0]

    def string(self) -> str:
        n = self.unpack("Q")
        return self._f.read(n).decode("utf-8", errors="surrogateescape")

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.unpack("I")
            count = self.unpack("Q")
            if etype in _SCALARS:  # one bulk read instead of `count` small ones
                fmt = _SCALARS[etype]
                data = self._f.read(struct.calcsize(fmt) * count)
                return list(struct.unpack(f"{self._e}{count}{fmt}", data))
            return [self.value(etype) for _ in range(count)]
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        raise GGUFError(f"unknown GGUF value type {vtype}; the file is corrupt or from a newer GGUF version.")


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """The key/value metadata of a GGUF file (versions 2 and 3, either byte order)."""
    with open(path, "rb", buffering=1 << 20) as f:
        if f.read(4) != _MAGIC:
            raise GGUFError(f"{path} does not start with the GGUF magic bytes, so it is not a GGUF file.")
        raw_version = f.read(4)
        endian = "<" if struct.unpack("<I", raw_version)[0] < 0x10000 else ">"
        version = struct.unpack(endian + "I", raw_version)[0]
        if version not in (2, 3):
            raise GGUFError(f"{path} is GGUF version {version}; only versions 2 and 3 are supported.")
        r = _Reader(f, endian)
        r.unpack("Q")  # tensor count
        kv_count = r.unpack("Q")
        metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = r.string()
            metadata[key] = r.value(r.unpack("I"))
        return metadata


def tokenizer_files_from_gguf(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """`(tokenizer.json, tokenizer_config.json)` contents for the tokenizer stored in a GGUF file."""
    md = read_gguf_metadata(path)
    model = md.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFError(
            f"{path}: tokenizer.ggml.model is {model!r}; only byte-level BPE ('gpt2') tokenizers can be rebuilt."
        )
    pre = md.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise GGUFError(
            f"{path}: tokenizer.ggml.pre {pre!r} is not supported; known: {', '.join(sorted(_PRE_TOKENIZERS))}."
        )
    tokens: list[str] = md["tokenizer.ggml.tokens"]
    types: list[int] = md.get("tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [m.split(" ", 1) for m in md["tokenizer.ggml.merges"]]
    added = [
        {
            "id": i,
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": types[i] == _CONTROL,
        }
        for i, tok in enumerate(tokens)
        if types[i] in (_CONTROL, _USER_DEFINED)
    ]
    tokenizer_json = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": _PRE_TOKENIZERS[pre],
        "post_processor": _post_processor(md, tokens),
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": merges,
        },
    }

    def token(key: str) -> str | None:
        i = md.get(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "add_bos_token": bool(md.get("tokenizer.ggml.add_bos_token", False)),
        "chat_template": md.get("tokenizer.chat_template"),
        "model_max_length": md.get(f"{md.get('general.architecture')}.context_length"),
        "clean_up_tokenization_spaces": False,
    }
    return tokenizer_json, config
