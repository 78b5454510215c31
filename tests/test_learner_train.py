"""``learner.train`` refuses what it cannot train on, before any torch runs; ``openforge lineage`` prints the chain.

The training itself (SFT and GRPO steps in the torch environment, TRL on the SFT shard) is in
tests/slow/test_learner_train.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from forge_store import open_store
from learner import ExportConfig, TrainError, export, train
from learner._cli import lineage_command
from tests.test_learner_sft import _rollout, _seed

NO_TORCH = Path(sys.executable)   # never reached: every refusal comes before the step runs


@pytest.fixture
def store(tmp_path, settings):
    st = open_store(f"sqlite:///{tmp_path / 's.sqlite'}", settings=settings)
    yield st
    st.close()


def _equal_rewards_shard(st, out: Path) -> Path:
    st.register_policy_version("p", model_name="m", global_step=0)
    st.create_group("g", task_id="t1", target_size=2)
    st.create_group("h", task_id="t1", target_size=2)
    for rid, gid, reward in (("a", "g", 1.0), ("b", "g", 1.0), ("c", "h", 0.0), ("d", "h", 0.0)):
        _rollout(st, rid, gid, "train", reward, pv="p")
    export(st, out, ExportConfig(format="verl"))
    return out


def test_train_refuses_a_shard_whose_advantages_are_all_zero(store, tmp_path):
    shard = _equal_rewards_shard(store, tmp_path / "x")
    with pytest.raises(TrainError) as e:
        train(store, shard, tmp_path / "ckpt", python=NO_TORCH)
    msg = str(e.value)
    assert "every advantage in the shard is 0" in msg and "2 groups all equal" in msg
    assert "GRPO has no signal" in msg and "--group-size" in msg and "openforge train --sft" in msg
    assert not (tmp_path / "ckpt").exists() and [p["id"] for p in store.lineage("policy_versions")] == ["p"]


def test_train_refuses_a_tampered_or_incomplete_shard(store, tmp_path):
    _seed(store)
    export(store, tmp_path / "x", ExportConfig(format="verl"))
    path = tmp_path / "x" / "trajectories-00000.parquet"
    saved = path.read_bytes()
    path.write_bytes(saved[:-12] + b"tampered1234")
    with pytest.raises(TrainError, match=r"trajectories-00000\.parquet: its sha256 differs from the manifest's"):
        train(store, tmp_path / "x", tmp_path / "ckpt", python=NO_TORCH)
    path.unlink()
    with pytest.raises(TrainError, match=r"trajectories-00000\.parquet: listed in the manifest but missing"):
        train(store, tmp_path / "x", tmp_path / "ckpt", python=NO_TORCH)
    with pytest.raises(TrainError, match="no manifest.json"):
        train(store, tmp_path, tmp_path / "ckpt", python=NO_TORCH)


def test_train_picks_the_algorithm_from_the_manifest(store, tmp_path):
    _seed(store)
    export(store, tmp_path / "trl", ExportConfig(format="trl"))
    with pytest.raises(TrainError, match="a 'trl' export; train reads veRL shards"):
        train(store, tmp_path / "trl", tmp_path / "ckpt", python=NO_TORCH)
    export(store, tmp_path / "verl", ExportConfig(format="verl"))
    with pytest.raises(TrainError, match="a verl export trains grpo, not sft"):
        train(store, tmp_path / "verl", tmp_path / "ckpt", python=NO_TORCH, algorithm="sft")
    export(store, tmp_path / "sft", ExportConfig(format="sft", where="purpose = 'teacher'"))
    with pytest.raises(TrainError, match="the shard holds a teacher's demonstrations.*pass --parent"):
        train(store, tmp_path / "sft", tmp_path / "ckpt", python=NO_TORCH)
    with pytest.raises(TrainError, match="--parent 'nope' is not a policy version in the store; known: student"):
        train(store, tmp_path / "sft", tmp_path / "ckpt", python=NO_TORCH, parent="nope")
    with pytest.raises(TrainError, match="policy version 'student' has no checkpoint folder"):
        train(store, tmp_path / "sft", tmp_path / "ckpt", python=NO_TORCH, parent="student")


def _chain(st):
    """base -> SFT -> GRPO, as learner.train registers them (metadata) next to the exports they name."""
    st.record_export("e-sft", format="sft", watermark=40, out_dir="/shards/sft", counts={})
    st.record_export("e-grpo", format="verl", watermark=90, out_dir="/shards/grpo-1", counts={})
    st.register_policy_version("base", model_name="SmolLM2", checkpoint_id="/models/base", global_step=0)
    st.register_policy_version("sft", model_name="SmolLM2", global_step=36, metadata={
        "parent": "base", "algorithm": "sft", "export_id": "e-sft", "shard": "/shards/sft", "watermark": 40,
        "sample_count": 96, "steps": 36, "loss_first": 2.5, "loss_last": 0.05})
    st.register_policy_version("grpo-1", model_name="SmolLM2", global_step=37, metadata={
        "parent": "sft", "algorithm": "grpo", "export_id": "e-grpo", "sample_count": 24, "steps": 1,
        "loss_first": 0.01, "loss_last": 0.01, "importance_ratio_mean": 1.0004})


def _lineage_cli(url: str, *args: str):
    app = typer.Typer()
    app.command()(lineage_command)
    return CliRunner().invoke(app, [*args, "--store", url], env={"COLUMNS": "200"})


def test_lineage_prints_the_chain(store, tmp_path):
    _chain(store)
    url = store.url
    r = _lineage_cli(url, "grpo-1")
    assert r.exit_code == 0, r.output
    assert "base (base) -> sft (sft) -> grpo-1 (grpo)" in r.output
    assert "/shards/sft" in r.output and "/shards/grpo-1" in r.output and "2.5 -> 0.05" in r.output
    r = _lineage_cli(url, "grpo-1", "--json")
    chain = json.loads(r.output)
    assert [(c["policy_version"], c["algorithm"], c["parent"]) for c in chain] == [
        ("base", "base", None), ("sft", "sft", "base"), ("grpo-1", "grpo", "sft")]
    # the GRPO version's metadata names no shard folder or watermark: the export's row in the store does
    assert (chain[2]["export_id"], chain[2]["shard"], chain[2]["watermark"], chain[2]["samples"]) == (
        "e-grpo", "/shards/grpo-1", 90, 24)
    assert chain[1]["watermark"] == 40 and chain[2]["importance_ratio_mean"] == 1.0004
    r = _lineage_cli(url, "grpo-7")
    assert r.exit_code == 2 and "policy version 'grpo-7' is not in the store; known: base, sft, grpo-1" in r.output


def test_openforge_train_refuses_with_the_reason(store, tmp_path):
    from openforge.train import train_command

    shard = _equal_rewards_shard(store, tmp_path / "x")
    app = typer.Typer()
    app.command()(train_command)
    r = CliRunner().invoke(app, ["--shard", str(shard), "--python", str(NO_TORCH), "--store", store.url],
                           env={"COLUMNS": "300", "OPENFORGE_HOME": str(tmp_path / "home")})
    assert r.exit_code == 2 and "every advantage in the shard is 0" in r.output, r.output
    r = CliRunner().invoke(app, ["--sft", "--shard", str(shard), "--python", str(NO_TORCH), "--store", store.url],
                           env={"COLUMNS": "300", "OPENFORGE_HOME": str(tmp_path / "home")})
    assert r.exit_code == 2 and "trains grpo, not sft" in r.output, r.output


def test_negative_weight_scales_only_the_negative_advantages():
    from learner.train_step import parse, weigh_negatives

    samples = [{"advantage": 1.5}, {"advantage": -0.5}, {"advantage": 0.0}, {"advantage": -2.0}]
    assert weigh_negatives(samples, 1.0) is samples
    assert [s["advantage"] for s in weigh_negatives(samples, 0.25)] == [1.5, -0.125, 0.0, -0.5]
    assert [s["advantage"] for s in weigh_negatives(samples, 0.0)] == [1.5, 0.0, 0.0, 0.0]
    assert [s["advantage"] for s in samples] == [1.5, -0.5, 0.0, -2.0]   # the inputs are not changed
    base = ["--samples", "s.jsonl", "--base", "b", "--out", "o"]
    assert parse(base).negative_weight == 1.0
    with pytest.raises(SystemExit):
        parse(base + ["--negative-weight", "1.5"])


def test_the_recipe_refuses_a_negative_weight_out_of_range():
    from openforge.loop_recipe import GrpoRecipe, RecipeError

    GrpoRecipe(negative_weight=0.0).check()
    with pytest.raises(RecipeError, match="--negative-weight -0.1"):
        GrpoRecipe(negative_weight=-0.1).check()
    assert GrpoRecipe(negative_weight=0.0).train_options()["negative_weight"] == 0.0


def test_auto_precision_is_bf16_only_where_the_cpu_has_native_bfloat16():
    from types import SimpleNamespace

    from learner.train_step import resolve_precision

    def fake_torch(native):
        def probe():
            if native is None:
                raise RuntimeError("no such op")
            return native
        return SimpleNamespace(ops=SimpleNamespace(mkldnn=SimpleNamespace(_is_mkldnn_bf16_supported=probe)))

    assert resolve_precision(fake_torch(True), "auto") == "bf16"
    assert resolve_precision(fake_torch(False), "auto") == "fp32"
    assert resolve_precision(fake_torch(None), "auto") == "fp32"   # a torch without the probe
    assert resolve_precision(fake_torch(False), "bf16") == "bf16"  # asked for: given, however slow


def test_train_layers_reaches_every_update_of_the_loop_and_bad_values_are_refused(tmp_path):
    from learner.train_step import parse
    from openforge.loop import LoopConfig, LoopError
    from openforge.loop_recipe import GrpoRecipe, RecipeError

    base = ["--samples", "s.jsonl", "--base", "b", "--out", "o"]
    assert parse(base).train_layers == 0 and parse(base + ["--train-layers", "10"]).train_layers == 10
    with pytest.raises(SystemExit):   # adapters on every block leave no backward pass to cut
        parse(base + ["--train-layers", "10", "--lora-rank", "4"])
    assert GrpoRecipe(train_layers=10).train_options()["train_layers"] == 10
    assert GrpoRecipe().train_options()["train_layers"] is None   # the step's default: every weight
    for bad in (GrpoRecipe(train_layers=-1), GrpoRecipe(train_layers=10, lora_rank=4)):
        with pytest.raises(RecipeError, match="--train-layers"):
            bad.check()
    cfg = LoopConfig(out=tmp_path, sft_train_layers=12, sft_lr=3e-4)
    assert cfg.sft_options() == {"lr": 3e-4, "train_layers": 12}
    assert LoopConfig(out=tmp_path).sft_options()["train_layers"] is None
    with pytest.raises(LoopError, match="--sft-train-layers -2"):
        LoopConfig(out=tmp_path, sft_train_layers=-2).check()


def test_schedule_shuffles_each_epoch_and_micro_batches_hold_the_token_budget():
    from learner._step_choices import TOKEN_BUDGET, micro_batches, schedule

    batches = schedule(10, 4, epochs=2, steps=None, seed=0)
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4, 2]
    assert sorted(sum(batches[:3], [])) == list(range(10)) and batches[:3] != batches[3:]
    assert len(schedule(10, 4, epochs=1, steps=5, seed=0)) == 5   # steps go round the epochs
    lengths = [3000, 100, 2000, 1500, 50]
    micro = micro_batches(lengths, lambda n: n)
    assert sorted(sum(micro, [])) == sorted(lengths)
    assert all(max(m) * len(m) <= TOKEN_BUDGET or len(m) == 1 for m in micro), micro


def test_grpo_samples_meet_the_shuffle_in_token_order_whatever_order_the_shard_gave():
    """The shard lists rows by random group and rollout ids; the batches must not depend on them."""
    import random

    from learner._step_choices import by_tokens, schedule

    samples = [{"prompt_ids": [1, p], "response_ids": [r], "response_mask": [1], "advantage": a}
               for p, r, a in ((5, 7, 1.0), (5, 7, -1.0), (2, 9, 0.5), (5, 3, -0.5))]
    orders = set()
    for seed in range(6):
        shard = samples[:]
        random.Random(seed).shuffle(shard)
        used = sorted(shard, key=by_tokens)
        orders.add(tuple(tuple(tuple(used[i]["response_ids"]) + (used[i]["advantage"],) for i in b)
                         for b in schedule(len(used), 2, 1, None, seed=0)))
    assert len(orders) == 1
    assert sorted(samples, key=by_tokens)[0] == samples[2]   # prompt [1, 2] first


def test_an_sft_anchor_is_an_sft_export_joined_to_grpo_steps_only(store, tmp_path):
    from learner.train_step import parse
    from openforge.loop import LearningLoop, LoopConfig
    from openforge.loop_recipe import GrpoRecipe, RecipeError

    _seed(store)
    export(store, tmp_path / "verl", ExportConfig(format="verl"))
    export(store, tmp_path / "sft", ExportConfig(format="sft", where="purpose = 'teacher'"))
    with pytest.raises(TrainError, match="a verl export; the anchor is an `openforge export --format sft` folder"):
        train(store, tmp_path / "verl", tmp_path / "ckpt", python=NO_TORCH, anchor=tmp_path / "verl", anchor_coef=0.5)
    with pytest.raises(TrainError, match="anchor_coef 0: an anchor .* belongs to GRPO updates, with a positive"):
        train(store, tmp_path / "verl", tmp_path / "ckpt", python=NO_TORCH, anchor=tmp_path / "sft", anchor_coef=0)
    with pytest.raises(TrainError, match="with a sft update"):
        train(store, tmp_path / "sft", tmp_path / "ckpt", python=NO_TORCH, parent="student", anchor=tmp_path / "sft",
              anchor_coef=0.5)
    base = ["--samples", "s.jsonl", "--base", "b", "--out", "o"]
    assert parse(base + ["--anchor-samples", "a.jsonl", "--anchor-coef", "0.5"]).anchor_coef == 0.5
    for bad in (["--anchor-samples", "a.jsonl"], ["--anchor-samples", "a.jsonl", "--anchor-coef", "1", "--algorithm",
                                                   "sft"]):
        with pytest.raises(SystemExit):
            parse(base + bad)
    with pytest.raises(RecipeError, match="--sft-anchor -1"):
        GrpoRecipe(sft_anchor=-1).check()
    with pytest.raises(RecipeError, match="--anchor-batch-size 0: .* pass 1 or more"):
        GrpoRecipe(sft_anchor=0.5, anchor_batch_size=0).check()
    loop = LearningLoop(LoopConfig(out=tmp_path, recipe=GrpoRecipe(sft_anchor=0.5, anchor_batch_size=2)), console=None)
    with pytest.raises(ValueError, match="sft_anchor needs the demonstrations' SFT export"):
        loop._anchor()
    loop.sft_shard = tmp_path / "sft"
    assert loop._anchor() == {"anchor": tmp_path / "sft", "anchor_coef": 0.5, "anchor_batch_size": 2}
    assert LearningLoop(LoopConfig(out=tmp_path, recipe=GrpoRecipe(sft_anchor=0)), console=None)._anchor() == {}
    assert GrpoRecipe().sft_anchor > 0   # the default recipe anchors (README: seeds 0, 1, 2 on 2026-12-05)


def test_a_kl_term_needs_a_reference_version_with_a_checkpoint_and_joins_grpo_steps_only(store, tmp_path):
    from learner.train_step import parse
    from openforge.loop import LearningLoop, LoopConfig
    from openforge.loop_recipe import GrpoRecipe, RecipeError

    _seed(store)
    export(store, tmp_path / "verl", ExportConfig(format="verl"))
    export(store, tmp_path / "sft", ExportConfig(format="sft", where="purpose = 'teacher'"))
    with pytest.raises(TrainError, match="reference 'nope' is not a policy version in the store"):
        train(store, tmp_path / "verl", tmp_path / "ckpt", python=NO_TORCH, reference="nope", kl_coef=0.01)
    with pytest.raises(TrainError, match="reference 'student' with a grpo update and kl_coef 0: .* or neither"):
        train(store, tmp_path / "verl", tmp_path / "ckpt", python=NO_TORCH, reference="student", kl_coef=0)
    with pytest.raises(TrainError, match="reference None with a grpo update and kl_coef 0.01"):
        train(store, tmp_path / "verl", tmp_path / "ckpt", python=NO_TORCH, kl_coef=0.01)
    with pytest.raises(TrainError, match="with a sft update"):
        train(store, tmp_path / "sft", tmp_path / "ckpt", python=NO_TORCH, parent="student", reference="student",
              kl_coef=0.01)
    with pytest.raises(TrainError, match="policy version 'student' has no checkpoint folder on this machine"):
        train(store, tmp_path / "verl", tmp_path / "ckpt", python=NO_TORCH, reference="student", kl_coef=0.01)
    from openforge.train import train_command

    app = typer.Typer()
    app.command()(train_command)
    r = CliRunner().invoke(app, ["--shard", str(tmp_path / "verl"), "--kl-coef", "0.1", "--python", str(NO_TORCH),
                                 "--store", store.url], env={"COLUMNS": "300", "OPENFORGE_HOME": str(tmp_path / "h")})
    assert r.exit_code == 2 and "reference None with a grpo update and kl_coef 0.1" in r.output, r.output
    base = ["--samples", "s.jsonl", "--base", "b", "--out", "o"]
    args = parse(base + ["--ref", "r", "--kl-coef", "0.01"])
    assert (args.ref, args.kl_coef, args.kl_type) == ("r", 0.01, "low_var_kl")
    for bad in (["--ref", "r"], ["--kl-coef", "0.1"], ["--ref", "r", "--kl-coef", "-1"],
                ["--ref", "r", "--kl-coef", "0.1", "--algorithm", "sft"], ["--ref", "r", "--kl-coef", "1",
                                                                           "--kl-type", "k9"]):
        with pytest.raises(SystemExit):
            parse(base + bad)
    with pytest.raises(RecipeError, match="--kl-coef -0.1"):
        GrpoRecipe(kl_coef=-0.1).check()
    loop = LearningLoop(LoopConfig(out=tmp_path, recipe=GrpoRecipe(kl_coef=0.01)), console=None)
    with pytest.raises(ValueError, match="kl_coef needs the SFT version as its reference"):
        loop._kl()
    loop.add_version("the-sft", None, "sft")
    assert loop._kl() == {"kl_coef": 0.01, "reference": "the-sft"}
    assert LearningLoop(LoopConfig(out=tmp_path), console=None)._kl() == {}   # the default recipe has none


def test_kl_penalty_refuses_an_estimator_veRL_does_not_have():
    """(Its values against veRL's own ``kl_penalty`` are checked in veRL's venv: tests/slow/test_verl_crosscheck.py.)"""
    from learner._step_losses import KL_TYPES, kl_penalty

    assert {"low_var_kl", "k3", "kl", "k1", "mse", "k2", "abs", "k3+"} <= set(KL_TYPES)
    with pytest.raises(ValueError, match="kl type 'k9': use one of low_var_kl"):
        kl_penalty(None, 0.0, 0.0, "k9")
