"""Policy switches in the running engine: `VllmServer.load_weights` swaps the served weights in place, no restart.

The learner's importance ratio is ~1.0 after a switch only if the engine then serves exactly the checkpoint's
weights: so a checkpoint that differs changes the answer and its logprobs, and loading the base back brings both
back bit for bit. A checkpoint of another shape is refused before the engine sees it, and the old weights go on.
"""

from __future__ import annotations

import json
import os
import subprocess

import httpx
import pytest

from proxy.engines import CheckpointError
from proxy.engines.vllm_cpu import CACHE_ENV, MODEL_NAME, ensure_env

pytestmark = pytest.mark.slow

PROMPT = [{"role": "user", "content": "Name three colours."}]
# One layer's MLP output scaled: a model that answers differently, saved as a trainer saves a checkpoint.
_SCALED = r"""
import sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
with torch.no_grad():
    model.model.layers[3].mlp.down_proj.weight.mul_(1.5)
model.save_pretrained(sys.argv[2])
"""


def _answer(http: httpx.Client) -> tuple[str, list[int], list[float]]:
    body = {"model": MODEL_NAME, "messages": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": True,
            "return_token_ids": True}
    r = http.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    choice = r.json()["choices"][0]
    return choice["message"]["content"], choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]


@pytest.fixture(scope="module")
def scaled_checkpoint(vllm_engine, tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "scaled"
    python = ensure_env(os.environ.get(CACHE_ENV), progress=False)
    subprocess.run([str(python), "-c", _SCALED, str(vllm_engine.weights_dir), str(out)], check=True,
                   capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return out


def test_load_weights_switches_and_the_base_comes_back_exactly(vllm_engine, scaled_checkpoint):
    base = vllm_engine.weights_dir
    with httpx.Client(base_url=vllm_engine.base_url.removesuffix("/v1"), timeout=300) as http:
        before = _answer(http)
        try:
            seconds = vllm_engine.load_weights(scaled_checkpoint)
            assert vllm_engine.weights_dir == scaled_checkpoint.resolve()
            switched = _answer(http)
        finally:
            back = vllm_engine.load_weights(base)
        after = _answer(http)
    assert 0 < seconds < 60 and 0 < back < 60
    assert switched[0] != before[0] and switched[2] != before[2]
    assert after == before  # text, token ids and logprobs, bit for bit


def test_a_checkpoint_of_another_shape_is_refused_and_the_old_weights_serve_on(vllm_engine, tmp_path):
    base = vllm_engine.weights_dir
    other = tmp_path / "two-layers"
    other.mkdir()
    config = json.loads((base / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    (other / "model.safetensors").symlink_to(base / "model.safetensors")
    with httpx.Client(base_url=vllm_engine.base_url.removesuffix("/v1"), timeout=300) as http:
        before = _answer(http)
        with pytest.raises(CheckpointError, match="num_hidden_layers: 30 -> 2"):
            vllm_engine.load_weights(other)
        assert vllm_engine.weights_dir == base
        assert _answer(http) == before
