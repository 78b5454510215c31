"""Writing the train step's checkpoint: the weights, then the base folder's tokenizer, chat template and configs,
and the sha256 the policy version records. Apart from ``train_step.py`` (which runs by path in the torch
environment) so that the step script stays one screenful of choices."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path


def save(model, base: Path, out: Path) -> str:
    """Write the checkpoint (weights, then the base's tokenizer, chat template and configs) and return the sha256
    of its weights."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for f in base.iterdir():   # tokenizer, chat template, generation config: unchanged
        if f.is_file() and not f.name.startswith(".") and not f.name.endswith((".safetensors", ".bin")) \
                and not (tmp / f.name).exists():
            shutil.copy2(f, tmp / f.name)
    digest = hashlib.sha256()
    for f in sorted(tmp.glob("*.safetensors")):
        digest.update(f.read_bytes())
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return digest.hexdigest()
