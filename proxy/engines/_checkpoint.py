"""Can this checkpoint folder replace the weights a running engine serves, in place?

vLLM's in-place reload (`reload_weights`) copies a checkpoint's tensors into the served model's parameters, layer by
layer; it keeps the served model's config (and so its architecture). A checkpoint of another architecture or shape
fails half way, with layers already swapped out, and leaves the engine unusable. So the folder is checked here
first, from its `config.json` and its safetensors headers (the first bytes of each file: the tensors themselves are
never read), and an incompatible one is refused before the engine sees it.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

__all__ = ["CheckpointError", "check_replaceable", "checkpoint_tensors"]

# config.json keys that decide the shapes or the computation; everything else (dtype, transformers_version,
# generation settings, _name_or_path) may differ between the served folder and a checkpoint trained from it.
ARCHITECTURE_KEYS = (
    "model_type", "architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "hidden_act", "rms_norm_eps",
    "rope_theta", "rope_scaling", "rope_parameters", "attention_bias", "mlp_bias",
)
_DTYPES = {"F32", "F16", "BF16"}  # what vLLM converts into the served dtype on load
_HEADER_CAP = 100 * 2**20  # safetensors' own limit on a header


class CheckpointError(ValueError):
    """The folder cannot replace the served weights (missing files, another architecture, other shapes)."""


def _read_header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise CheckpointError(f"{path} is not a safetensors file (shorter than its 8-byte header length).")
        (n,) = struct.unpack("<Q", raw)
        if n > _HEADER_CAP:
            raise CheckpointError(f"{path}: a {n}-byte header is not a safetensors header; the file is corrupt.")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise CheckpointError(f"{path}: the safetensors header is not JSON ({e}); the file is corrupt.") from None
    header.pop("__metadata__", None)
    end = max((t["data_offsets"][1] for t in header.values()), default=0)
    if path.stat().st_size < 8 + n + end:
        raise CheckpointError(f"{path} is truncated: {path.stat().st_size} bytes, its header needs {8 + n + end}.")
    return header


def checkpoint_tensors(folder: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """`{tensor name: (dtype, shape)}` over every `*.safetensors` file of `folder`."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        found = ", ".join(sorted(p.name for p in folder.iterdir())[:10]) if folder.is_dir() else "no such folder"
        raise CheckpointError(
            f"{folder} holds no *.safetensors file ({found}); save the checkpoint with "
            "`model.save_pretrained(folder)` (safetensors is transformers' default)."
        )
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for path in files:
        for name, t in _read_header(path).items():
            out[name] = (t["dtype"], tuple(t["shape"]))
    return out


def _config(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{folder} has no config.json; save the checkpoint with `save_pretrained`.") from None
    except ValueError as e:
        raise CheckpointError(f"{folder}/config.json is not JSON ({e}).") from None


def _comparable(tensors: dict[str, tuple[str, tuple[int, ...]]], tied: bool) -> dict[str, tuple[int, ...]]:
    """Shapes by name; a tied model's `lm_head.weight` is its embedding, whether a checkpoint writes it or not."""
    return {k: shape for k, (_, shape) in tensors.items() if not (tied and k == "lm_head.weight")}


def check_replaceable(served: Path, checkpoint: Path) -> None:
    """Raise `CheckpointError` unless `checkpoint` has the served model's architecture and every one of its tensors,
    shape for shape (in float32, float16 or bfloat16)."""
    want, got = _config(served), _config(checkpoint)
    both = [k for k in ARCHITECTURE_KEYS if k in want and k in got]  # a key one side leaves out keeps its default
    changed = [f"{k}: {want[k]!r} -> {got[k]!r}" for k in both if want[k] != got[k]]
    if changed:
        raise CheckpointError(
            f"{checkpoint} is not a checkpoint of the served model ({served}): its config.json differs in "
            f"{'; '.join(changed)}. An in-place reload keeps the served architecture; start a new engine for it."
        )
    tied = bool(want.get("tie_word_embeddings"))
    ckpt = checkpoint_tensors(checkpoint)
    odd = sorted(f"{k} ({d})" for k, (d, _) in ckpt.items() if d not in _DTYPES)
    a, b = _comparable(checkpoint_tensors(served), tied), _comparable(ckpt, tied)
    problems = [f"missing {k}" for k in sorted(a.keys() - b.keys())]
    problems += [f"unexpected {k}" for k in sorted(b.keys() - a.keys())]
    problems += [f"{k}: shape {list(b[k])}, served {list(a[k])}" for k in sorted(a.keys() & b.keys()) if a[k] != b[k]]
    problems += [f"dtype of {x} is not float32, float16 or bfloat16" for x in odd]
    if problems:
        more = f" (and {len(problems) - 6} more)" if len(problems) > 6 else ""
        raise CheckpointError(
            f"{checkpoint} cannot replace the served weights of {served}: {'; '.join(problems[:6])}{more}. "
            "Save the full model (all tensors, same shapes) with `save_pretrained`."
        )
