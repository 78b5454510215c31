"""Helpers for tests/slow/test_learner_train.py that need torch: run by path in the torch environment (the vLLM CPU
venv), each prints one JSON line.

    python torch_scripts.py tiny SRC_MODEL DST          a tiny random Llama with SRC's tokenizer and chat template
    python torch_scripts.py logprobs MODEL CALLS.json   each call's completion logprobs under MODEL (an "engine")
    python torch_scripts.py trl SHARD MODEL WORK        TRL's SFTTrainer on an SFT shard, as it is
    python torch_scripts.py sample MODEL SPEC.json      completions sampled from MODEL, with ids and logprobs
    python torch_scripts.py changed MODEL_A MODEL_B     the names of the weights that differ between two checkpoints
"""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "generation_config.json")


def tiny(src: str, dst: str) -> dict:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = Path(dst)
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (Path(src) / name).exists():
            shutil.copy(Path(src) / name, out / name)
    tok = AutoTokenizer.from_pretrained(out)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    return {"model": str(out), "generation_template": bool(re.search(r"generation\s*-?%", tok.chat_template or ""))}


def logprobs(model_dir: str, calls_path: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for c in json.loads(Path(calls_path).read_text()):
            ids = torch.tensor([c["prompt_ids"] + c["completion_ids"]])
            p, r = len(c["prompt_ids"]), len(c["completion_ids"])
            logp = torch.log_softmax(model(ids).logits[0, p - 1:p + r - 1].float(), dim=-1)
            out.append(logp.gather(1, ids[0, p:].unsqueeze(1)).squeeze(1).tolist())
    return {"logprobs": out}


def sample(model_dir: str, spec_path: str) -> dict:
    """Completions sampled from MODEL (temperature 1, seeded) for each prompt of SPEC ({"prompts": [messages...],
    "n": N, "max_new_tokens": M, "tools": [...]}), with their prompt ids, completion ids and logprobs: what an
    engine would record."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = json.loads(Path(spec_path).read_text())
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    torch.manual_seed(0)
    out = []
    for messages in spec["prompts"]:
        prompt = tok.apply_chat_template(messages, tools=spec.get("tools"), add_generation_prompt=True,
                                         tokenize=True, return_dict=True)["input_ids"]
        for _ in range(spec["n"]):
            with torch.no_grad():
                gen = model.generate(torch.tensor([prompt]), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                     max_new_tokens=spec["max_new_tokens"], pad_token_id=tok.eos_token_id)
            completion = gen[0, len(prompt):].tolist()
            ids = torch.tensor([prompt + completion])
            with torch.no_grad():
                logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1:-1].float(), dim=-1)
            out.append({"prompt_ids": prompt, "completion_ids": completion, "text": tok.decode(completion),
                        "logprobs": logp.gather(1, ids[0, len(prompt):].unsqueeze(1)).squeeze(1).tolist()})
    return {"samples": out}


def trl(shard: str, model_dir: str, work: str) -> dict:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    ds = datasets.load_dataset("parquet", data_files=str(Path(shard) / "conversations-*.parquet"), split="train",
                               cache_dir=str(Path(work) / "hf-cache"))
    tok = AutoTokenizer.from_pretrained(model_dir)
    assistant_only = bool(re.search(r"generation\s*-?%", tok.chat_template or ""))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = SFTConfig(output_dir=str(Path(work) / "out"), max_steps=2, per_device_train_batch_size=2,
                     learning_rate=1e-3, report_to=[], save_strategy="no", use_cpu=True,
                     assistant_only_loss=assistant_only, logging_steps=1)
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    result = trainer.train()
    delta = math.sqrt(sum(float((p.detach() - before[n]).pow(2).sum()) for n, p in model.named_parameters()))
    row = trainer.train_dataset[0]
    trained = [t for t, lab in zip(row["input_ids"], row["labels"]) if lab != -100]
    return {"rows": ds.num_rows, "loss": result.training_loss, "weight_delta_l2": delta,
            "assistant_only_loss": assistant_only, "tokens": len(row["input_ids"]), "trained_tokens": len(trained),
            "trained_text": tok.decode(trained), "arguments": ds[0]["messages"][2]["tool_calls"][0]["function"]
            ["arguments"], "tools": ds[0]["tools"]}


def changed(a: str, b: str) -> dict:
    from safetensors.torch import load_file

    wa, wb = load_file(str(Path(a) / "model.safetensors")), load_file(str(Path(b) / "model.safetensors"))
    return {"names": sorted(wa), "changed": sorted(n for n in wa if not wa[n].equal(wb[n]))}


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    print(json.dumps({"tiny": tiny, "logprobs": logprobs, "trl": trl, "sample": sample, "changed": changed}[cmd](*rest)))
