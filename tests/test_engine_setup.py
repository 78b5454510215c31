"""The CPU engine's model folder and policy switches, without starting vLLM (tests/slow/ starts it).

- `ensure_model` writes the served chat template and the generation defaults into the folder, and upgrades a folder
  converted by an earlier version in place (the weights stay);
- the server is started with no max_tokens ceiling;
- `VllmServer.load_weights` refuses a checkpoint the engine cannot take before the engine is touched, and when the
  engine fails a reload, it loads the previous weights again and says so.
"""

from __future__ import annotations

import http.server
import json
import os
import struct
import threading
from pathlib import Path
from typing import ClassVar

import pytest

from proxy.engines import (
    DEFAULT_MAX_TOKENS,
    CheckpointError,
    VllmServer,
    chat_template,
    ensure_model,
)
from proxy.engines._checkpoint import check_replaceable
from proxy.engines._setup import ENV_SPEC, MODEL_SPEC, READY, WEIGHTS_SPEC
from proxy.engines.vllm_cpu import RELOAD_METHOD, server_command, server_env

CONFIG = {"model_type": "llama", "hidden_size": 4, "num_hidden_layers": 1, "vocab_size": 8, "tie_word_embeddings": True,
          "rms_norm_eps": 1e-5}
TENSORS = {"model.embed_tokens.weight": [8, 4], "model.layers.0.mlp.down_proj.weight": [4, 4],
           "model.norm.weight": [4]}


def write_safetensors(path: Path, tensors: dict[str, list[int]], dtype: str = "F32", cut: int = 0) -> None:
    """A valid safetensors file of zeros (4-byte elements), optionally `cut` bytes short."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = 4
        for n in shape:
            size *= n
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * (offset - cut))


def checkpoint(folder: Path, config: dict | None = None, tensors: dict | None = None, **kw) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or CONFIG))
    write_safetensors(folder / "model.safetensors", TENSORS if tensors is None else tensors, **kw)
    return folder


@pytest.fixture
def served(tmp_path) -> Path:
    return checkpoint(tmp_path / "served")


def test_a_checkpoint_trained_from_the_served_model_is_accepted(served, tmp_path):
    check_replaceable(served, checkpoint(tmp_path / "same"))
    trained = {**CONFIG, "transformers_version": "9", "dtype": "bfloat16", "architectures": ["LlamaForCausalLM"]}
    check_replaceable(served, checkpoint(tmp_path / "bf16", trained, {**TENSORS, "lm_head.weight": [8, 4]}, dtype="BF16"))


@pytest.mark.parametrize("config,tensors,kw,message", [
    ({**CONFIG, "num_hidden_layers": 2}, None, {}, "num_hidden_layers: 1 -> 2"),
    ({**CONFIG, "rms_norm_eps": 1e-6}, None, {}, "rms_norm_eps"),
    (None, {k: v for k, v in TENSORS.items() if k != "model.norm.weight"}, {}, "missing model.norm.weight"),
    (None, {**TENSORS, "model.layers.1.mlp.down_proj.weight": [4, 4]}, {}, "unexpected model.layers.1"),
    (None, {**TENSORS, "model.norm.weight": [5]}, {}, r"model.norm.weight: shape \[5\], served \[4\]"),
    (None, None, {"dtype": "I32"}, "not float32, float16 or bfloat16"),
    (None, None, {"cut": 3}, "is truncated"),
])
def test_a_checkpoint_the_engine_cannot_take_is_refused_with_what_differs(served, tmp_path, config, tensors, kw,
                                                                           message):
    with pytest.raises(CheckpointError, match=message):
        check_replaceable(served, checkpoint(tmp_path / "other", config, tensors, **kw))


def test_a_folder_without_weights_or_config_is_refused(served, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps(CONFIG))
    (empty / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors file \(config.json, pytorch_model.bin\)"):
        check_replaceable(served, empty)
    (empty / "config.json").unlink()
    with pytest.raises(CheckpointError, match="has no config.json"):
        check_replaceable(served, empty)


def test_ensure_model_upgrades_a_folder_converted_by_an_earlier_version_in_place(tmp_path):
    """Same weights spec, older serving files: only the template and the generation defaults are (re)written."""
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / READY).write_text(json.dumps(ENV_SPEC))
    model = checkpoint(tmp_path / "model")
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "max_new_tokens": 64}))
    (model / READY).write_text(json.dumps(WEIGHTS_SPEC))
    weights = (model / "model.safetensors").read_bytes()
    assert ensure_model(tmp_path, progress=False) == model
    assert json.loads((model / "tokenizer_config.json").read_text()) == {"eos_token": "<|im_end|>",
                                                                         "chat_template": chat_template()}
    assert (model / "chat_template.jinja").read_text() == chat_template()  # transformers reads this one first
    assert json.loads((model / "generation_config.json").read_text()) == {"eos_token_id": 2,
                                                                          "max_new_tokens": DEFAULT_MAX_TOKENS}
    assert json.loads((model / READY).read_text()) == MODEL_SPEC
    assert (model / "model.safetensors").read_bytes() == weights


def test_the_server_sets_defaults_and_no_ceiling(tmp_path):
    """max_new_tokens given on the command line (or as a --generation-config folder) caps every request in vLLM."""
    argv = server_command(tmp_path / "python", tmp_path / "model", 8000)
    assert "max_new_tokens" not in " ".join(argv)
    assert argv[argv.index("--generation-config") + 1] == "auto"
    assert json.loads(argv[argv.index("--override-generation-config") + 1]) == {"temperature": 0.0}


def test_the_server_loads_the_reload_that_prepares_the_tied_output_layer(tmp_path):
    """The worker extension is named on the command line and importable from the server's PYTHONPATH."""
    argv = server_command(tmp_path / "python", tmp_path / "model", 8000)
    module, _, cls = argv[argv.index("--worker-extension-cls") + 1].rpartition(".")
    folder = server_env(tmp_path)["PYTHONPATH"].split(os.pathsep)[0]
    assert (Path(folder) / f"{module}.py").is_file()
    source = (Path(folder) / f"{module}.py").read_text()
    assert f"class {cls}" in source and f"def {RELOAD_METHOD}(" in source


@pytest.mark.parametrize("max_model_len", [8192, 1024])
def test_the_server_prefills_every_prompt_in_one_step(tmp_path, max_model_len):
    """A seeded request prefilled in chunks kills vLLM 0.32's CPU engine (tests/slow/test_vllm_cpu.py shows it); so no
    chunked prefill, and a step budget that holds the longest prompt (vLLM refuses a smaller one then)."""
    argv = server_command(tmp_path / "python", tmp_path / "model", 8000, max_model_len=max_model_len)
    assert "--no-enable-chunked-prefill" in argv and "--enable-chunked-prefill" not in argv
    assert int(argv[argv.index("--max-num-batched-tokens") + 1]) >= max_model_len


class _FakeDevRoutes(http.server.BaseHTTPRequestHandler):
    """vLLM's dev routes, whose reload fails for one folder (the real engine cannot be made to fail a reload of a
    checkpoint that passes the check on demand)."""

    calls: ClassVar[list[tuple[str, dict | None]]] = []
    failing = ""

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.loads(raw) if raw else None
        self.calls.append((self.path, body))
        fail = body and body.get("kwargs", {}).get("weights_path") == self.failing
        self.send_response(500 if fail else 200)
        self.end_headers()
        self.wfile.write(b'{"error": "boom"}' if fail else b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_engine():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeDevRoutes)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _FakeDevRoutes.calls = []
    yield srv
    srv.shutdown()


def test_load_weights_drains_reloads_resets_and_resumes(fake_engine, served, tmp_path):
    engine = VllmServer.attach(f"http://127.0.0.1:{fake_engine.server_port}/v1", served)
    new = checkpoint(tmp_path / "new")
    assert engine.load_weights(new) >= 0 and engine.weights_dir == new.resolve()
    assert [p for p, _ in _FakeDevRoutes.calls] == ["/pause?mode=wait", "/collective_rpc", "/reset_prefix_cache",
                                                    "/resume"]
    assert _FakeDevRoutes.calls[1][1] == {"method": "openforge_reload_weights",
                                          "kwargs": {"weights_path": str(new.resolve())}}


def test_a_reload_the_engine_fails_loads_the_previous_weights_again(fake_engine, served, tmp_path):
    engine = VllmServer.attach(f"http://127.0.0.1:{fake_engine.server_port}/v1", served)
    bad = checkpoint(tmp_path / "bad")
    _FakeDevRoutes.failing = str(bad.resolve())
    with pytest.raises(RuntimeError, match=r"answered 500 .*boom.*\n.*were loaded again"):
        engine.load_weights(bad)
    assert engine.weights_dir == served.resolve()
    reloads = [b["kwargs"]["weights_path"] for p, b in _FakeDevRoutes.calls if p == "/collective_rpc"]
    assert reloads == [str(bad.resolve()), str(served.resolve())]
    assert _FakeDevRoutes.calls[-1][0] == "/resume"


def test_an_incompatible_checkpoint_is_refused_before_the_engine_is_touched(fake_engine, served, tmp_path):
    engine = VllmServer.attach(f"http://127.0.0.1:{fake_engine.server_port}/v1", served)
    with pytest.raises(CheckpointError):
        engine.load_weights(checkpoint(tmp_path / "big", {**CONFIG, "hidden_size": 8}))
    assert _FakeDevRoutes.calls == [] and engine.weights_dir == served.resolve()


def test_load_weights_needs_a_running_server(served):
    with pytest.raises(RuntimeError, match="not running"):
        VllmServer().load_weights(served)
