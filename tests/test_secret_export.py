"""End to end: a secret in a prompt that went through the real proxy is not in the stored text, and the rollout
that carried it is in no default training shard (its token ids still hold the secret); ``include_redacted`` is
the explicit way to keep it. One GRPO group of three rollouts, one of which saw a secret."""

from __future__ import annotations

import pandas as pd

from learner import ExportConfig, export

SECRET = "sk_live_" + "51HqLyjWDarjtT1zdp7dcQx"


def _group(px) -> None:
    st = px.store
    st.register_task("t1")
    st.create_group("g1", task_id="t1", target_size=3)
    for rid, text, reward in (("r-secret", f"my key is {SECRET}, fix the config", 1.0),
                              ("r-a", "fix the config", 0.0), ("r-b", "fix the config please", 1.0)):
        client = px.client(px.register(rid, group_id="g1", task_id="t1"))
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
        px.end(rid, "success" if reward else "failure")
        st.add_reward(rid, reward)
    assert st.flush(30)


def _shard_rollouts(out) -> set[str]:
    return set(pd.concat([pd.read_parquet(f) for f in sorted(out.glob("trajectories-*.parquet"))])["rollout_id"])


def test_a_rollout_that_carried_a_secret_is_in_no_default_shard(px, tmp_path):
    _group(px)
    call = px.calls("r-secret")[0]
    assert SECRET not in str(call.messages) and call.metadata["redacted"] == ["api_keys"]
    m = export(px.store, tmp_path / "default", ExportConfig(format="verl"))
    assert m["exclusions"].get("redacted") == 1
    assert _shard_rollouts(tmp_path / "default") == {"r-a", "r-b"}
    kept = export(px.store, tmp_path / "kept", ExportConfig(format="verl", include_redacted=True))
    assert "redacted" not in kept["exclusions"]
    assert _shard_rollouts(tmp_path / "kept") == {"r-secret", "r-a", "r-b"}
