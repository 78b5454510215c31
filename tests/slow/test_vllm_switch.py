"""Policy switches in the running engine: `VllmServer.load_weights` swaps the served weights in place, no restart.

The learner's importance ratio is ~1.0 after a switch only if the engine then serves exactly the checkpoint's
weights: so a checkpoint that differs changes the answer and its logprobs, and loading the base back brings both
back bit for bit. A checkpoint of another shape is refused before the engine sees it, and the old weights go on.

The output layer too: SmolLM2 ties it to the input embedding, and vLLM's CPU reload left the output layer's
prepared kernel on the weights the engine started with (the worker extension prepares it again). A checkpoint that
changes only the embedding must then be served with the logprobs a Hugging Face model of that checkpoint computes.
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

# The input embedding (= the tied output layer) with 5% noise, nothing else.
_EMBEDDING = r"""
import sys, torch
from transformers import AutoModelForCausalLM
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
w = model.get_input_embeddings().weight
with torch.no_grad():
    w.add_(torch.randn_like(w) * w.std() * 0.05)
model.save_pretrained(sys.argv[2])
"""
# Teacher-forced logprobs of a completion under a checkpoint, in float32: what the learner's scorer computes.
_SCORE = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
prompt, completion = json.loads(sys.argv[2]), json.loads(sys.argv[3])
ids = torch.tensor([prompt + completion])
with torch.no_grad():
    logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
print(json.dumps([logp[len(prompt) + i - 1, t].item() for i, t in enumerate(completion)]))
"""


def _checkpoint(vllm_engine, out, script: str):
    python = ensure_env(os.environ.get(CACHE_ENV), progress=False)
    subprocess.run([str(python), "-c", script, str(vllm_engine.weights_dir), str(out)], check=True,
                   capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return out


def _answer(http: httpx.Client) -> tuple[str, list[int], list[float]]:
    body = {"model": MODEL_NAME, "messages": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": True,
            "return_token_ids": True}
    r = http.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    choice = r.json()["choices"][0]
    return choice["message"]["content"], choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]


@pytest.fixture(scope="module")
def scaled_checkpoint(vllm_engine, tmp_path_factory):
    return _checkpoint(vllm_engine, tmp_path_factory.mktemp("ckpt") / "scaled", _SCALED)


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


def test_a_reload_serves_the_new_tied_output_layer_too(vllm_engine, tmp_path):
    """Sampled tokens' logprobs after a switch to a checkpoint that changed only the (tied) embedding equal a
    Hugging Face scorer's of that checkpoint. Before the worker extension the engine kept the first weights' output
    layer: per-token differences up to ~1 nat."""
    base = vllm_engine.weights_dir
    ckpt = _checkpoint(vllm_engine, tmp_path / "embedding", _EMBEDDING)
    body = {"model": MODEL_NAME, "messages": PROMPT, "max_tokens": 24, "temperature": 1.0, "logprobs": True,
            "return_token_ids": True}
    with httpx.Client(base_url=vllm_engine.base_url, timeout=300) as http:
        try:
            vllm_engine.load_weights(ckpt)
            r = http.post("/chat/completions", json=body)
        finally:
            vllm_engine.load_weights(base)
    r.raise_for_status()
    data = r.json()
    choice = data["choices"][0]
    engine = [e["logprob"] for e in choice["logprobs"]["content"]]
    python = ensure_env(os.environ.get(CACHE_ENV), progress=False)
    out = subprocess.run([str(python), "-c", _SCORE, str(ckpt), json.dumps(data["prompt_token_ids"]),
                          json.dumps(choice["token_ids"])], check=True, capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    scorer = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(engine) == len(scorer) == len(choice["token_ids"]) > 0
    worst = max(abs(a - b) for a, b in zip(engine, scorer))
    assert worst < 1e-3, f"engine vs scorer of the switched-in checkpoint: worst token differs by {worst:.4f} nats"
