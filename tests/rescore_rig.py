"""A small real store to re-score: agent-like rollouts recorded through the proxy from the CPU vLLM engine (two turns
each, the second extending the first, temperature 1), in GRPO groups with mixed rewards, under a policy version
``base`` whose checkpoint is the engine's model folder. Used by tests/slow/test_rescore.py and bench/rescore.py."""

from __future__ import annotations

from pathlib import Path

from proxy.engines.vllm_cpu import MODEL_NAME
from tests.proxy_fixtures import Up, make_proxy

PROMPTS = ["Rename notes_4.txt to plan_7.md using a shell command.", "Delete the file apple_12.txt.",
           "List the files in /tmp, largest first.", "Count the lines of report.csv.",
           "Make a folder called backups and copy config.ini into it.", "Print the first line of todo.md."]
SYSTEM = "You are a terse shell assistant. Answer with one command."


def record(server_url: str, work: Path, store_url: str, model_dir: Path, *, groups: int = 3, per_group: int = 2,
           max_tokens: int = 24, seed: int = 0) -> dict:
    """Record ``groups`` x ``per_group`` two-turn rollouts; returns {"rollouts", "calls", "policy_version"}."""
    root = server_url.removesuffix("/v1")
    px, serve = make_proxy(Up(double=None, url=root, server=None), work, store_url=store_url)
    try:
        r = px.admin("POST", "/admin/policy_versions", json={
            "id": "base", "model_name": MODEL_NAME, "checkpoint_id": str(model_dir), "global_step": 0,
            "engine": "vllm", "activate": True})
        assert r.status_code == 200, r.text
        n = 0
        for g in range(groups):
            group = f"g{g}"
            px.store.create_group(group, task_id=f"t{g}", target_size=per_group, policy_version_id="base")
            for j in range(per_group):
                rid = f"r{g}x{j}"
                client = px.client(px.register(rid, group_id=group, task_id=f"t{g}",
                                               metadata={"purpose": "train"}), timeout=600)
                messages = [{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": PROMPTS[g % len(PROMPTS)]}]
                for turn in range(2):
                    out = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=max_tokens,
                                                         temperature=1.0, seed=seed + 100 * g + 10 * j + turn)
                    messages += [{"role": "assistant", "content": out.choices[0].message.content or ""},
                                 {"role": "user", "content": "Now explain it in one sentence."}]
                    n += 1
                px.end(rid, "success" if j % 2 == 0 else "failure")
                px.store.add_reward(rid, 1.0 if j % 2 == 0 else 0.0)
        assert px.store.flush(60)
        return {"rollouts": groups * per_group, "calls": n, "policy_version": "base"}
    finally:
        serve.stop()
        px.store.close()
