"""bench/learning_curve.py without running a loop: arguments that cannot go together are refused, and a measured seed
pools from its two small files (``demo-result.json`` + ``outcomes.json``, what ``bench/results/`` keeps) without its
store."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from learner import TaskAgg

_spec = importlib.util.spec_from_file_location("learning_curve",
                                               Path(__file__).parents[1] / "bench" / "learning_curve.py")
curve = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(curve)


def test_seed_with_seeds_is_refused(capsys):
    for extra in (["--seeds", "2"], ["--first-seed", "1"]):
        with pytest.raises(SystemExit) as exc:
            curve.main(["--seed", "0", *extra])
        assert exc.value.code == 2 and "--seed 0 names the seeds" in capsys.readouterr().err


def _agg(passed: int, tools: dict[str, int]) -> TaskAgg:
    return TaskAgg(family="files", n=1, passed=passed, tool_calls=sum(tools.values()), tools=Counter(tools),
                   coverage=[0.5], efficiency=[1.0] if passed else [])


def test_task_aggregate_round_trips_through_json_and_refuses_unknown_fields():
    agg = _agg(1, {"bash": 2, "write_file": 1})
    assert TaskAgg.from_dict(json.loads(json.dumps(agg.as_dict()))) == agg
    with pytest.raises(ValueError, match=r"unknown fields \['passes'\]"):
        TaskAgg.from_dict({"passes": 1})


def test_a_seed_pools_from_its_two_files_and_one_without_outcomes_is_refused_by_name(tmp_path, capsys):
    home = tmp_path / "seed7"
    home.mkdir()
    doc = {"roles": {"base": "v0", "sft": "v1", "final": "v2"}, "eval_runs": {"v0": "r0", "v1": "r1", "v2": "r2"},
           "minutes": 12.5, "heldout_tasks": 4, "machine": {"cpu": "AMD EPYC", "simd": ["avx2"]}}
    (home / "demo-result.json").write_text(json.dumps(doc))
    with pytest.raises(SystemExit, match="neither store.sqlite nor outcomes.json"):
        curve.main(["--seed", "7", "--keep", str(tmp_path), "--n-boot", "50"])
    # the base passes none of 4 tasks, SFT 1, the final version 3
    roles = {"base": [0, 0, 0, 0], "sft": [1, 0, 0, 0], "final": [1, 1, 1, 0]}
    saved = {role: {f"s7:t{i}": _agg(p, {"bash": 1 + p}).as_dict() for i, p in enumerate(ps)}
             for role, ps in roles.items()}
    (home / "outcomes.json").write_text(json.dumps({"seed": 7, "greedy": saved, "sampled": None}))
    assert curve.main(["--seed", "7", "--keep", str(tmp_path), "--n-boot", "50"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    pool = out["pooled"]
    assert (pool["success_base"], pool["success_sft"], pool["success_final"]) == (0.0, 0.25, 0.75)
    # the seed's machine is the one its loop ran on (kept in its result), the top level's the one that pooled it
    assert out["seeds"][0]["machine"] == doc["machine"] and out["machine"]["cpus"] >= 1
    assert pool["final_minus_sft"] == 0.5 and pool["minutes"] == [12.5]
    assert sorted(p.name for p in home.iterdir()) == ["demo-result.json", "outcomes.json"]   # read, nothing written


def test_a_control_from_some_seeds_only_says_so_in_its_target(tmp_path, capsys):
    for seed, control in ((7, True), (8, False)):
        home = tmp_path / f"seed{seed}"
        home.mkdir()
        roles = {"base": [0, 0], "sft": [1, 0], "final": [1, 1], **({"sft_extended": [0, 0]} if control else {})}
        (home / "demo-result.json").write_text(json.dumps({"roles": {r: f"v-{r}" for r in roles}, "minutes": 1.0}))
        saved = {role: {f"s{seed}:t{i}": _agg(p, {"bash": 1}).as_dict() for i, p in enumerate(ps)}
                 for role, ps in roles.items()}
        (home / "outcomes.json").write_text(json.dumps({"seed": seed, "greedy": saved, "sampled": None}))
    assert curve.main(["--seed", "7", "--seed", "8", "--keep", str(tmp_path), "--n-boot", "50"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["pooled"]["sft_extended_seeds"] == [1, 2] and doc["pooled"]["final_minus_sft_extended"] == 1.0
    assert doc["targets"]["final - SFT extended > 0"] == "met (the control ran on 1 of 2 seeds)"


_kept_spec = importlib.util.spec_from_file_location("compare_kept",
                                                    Path(__file__).parents[1] / "bench" / "compare_kept.py")
kept = importlib.util.module_from_spec(_kept_spec)
_kept_spec.loader.exec_module(kept)


def _kept_seed(folder: Path, roles: dict[str, list[int]], seed: int = 7) -> Path:
    home = folder / f"seed{seed}"
    home.mkdir(parents=True)
    (home / "demo-result.json").write_text(json.dumps({"roles": {r: f"v-{r}" for r in roles}}))
    saved = {role: {f"s{seed}:t{i}": _agg(p, {"bash": 1}).as_dict() for i, p in enumerate(ps)}
             for role, ps in roles.items()}
    (home / "outcomes.json").write_text(json.dumps({"seed": seed, "greedy": saved, "sampled": None}))
    return home


def test_versions_of_two_kept_runs_compare_paired_by_task_and_other_tasks_are_refused(tmp_path, capsys):
    short = _kept_seed(tmp_path / "short", {"sft": [1, 0, 0, 0], "sft_extended": [1, 1, 0, 0]})
    long = _kept_seed(tmp_path / "long", {"sft": [1, 1, 1, 0]})
    assert kept.main([f"{short}:sft_extended", f"{long}:sft", "--n-boot", "50"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    success = next(r for r in doc["rubrics"] if r["metric"] == "success_rate")
    assert doc["tasks"] == 4 and (success["a"], success["b"], success["diff"]) == (0.5, 0.75, 0.25)
    assert success["paired"] and success["p_value"] == 1.0   # one task gained, none lost: McNemar's exact p
    other = _kept_seed(tmp_path / "other", {"sft": [1, 0, 0]})
    with pytest.raises(SystemExit, match=r"different tasks \(4 and 3; s7:t3 is in A only\)"):
        kept.main([f"{short}:sft", f"{other}:sft"])
    with pytest.raises(SystemExit, match="no role 'final' there; it has sft, sft_extended"):
        kept.main([f"{short}:final", f"{long}:sft"])
    with pytest.raises(SystemExit, match="ran no sampled evaluation"):
        kept.main([f"{short}:sft", f"{long}:sft", "--sampled"])
    with pytest.raises(SystemExit, match="expected SEED_DIR:ROLE"):
        kept.main([str(short), f"{long}:sft"])
    with pytest.raises(SystemExit, match="short is not a seed folder"):
        kept.main([f"{short.parent}:sft", f"{long}:sft"])


def test_a_stopped_run_with_outcomes_only_compares_and_one_with_neither_file_is_refused(tmp_path, capsys):
    stopped = _kept_seed(tmp_path / "stopped", {"sft": [0, 0, 1, 1]})
    (stopped / "demo-result.json").unlink()   # stopped before its result; outcomes read from its store
    (stopped / "store.sqlite").write_bytes(b"")   # its store still there: the saved outcomes are what count
    long = _kept_seed(tmp_path / "long", {"sft": [1, 1, 1, 0]})
    assert kept.main([f"{stopped}:sft", f"{long}:sft", "--n-boot", "50"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    success = next(r for r in doc["rubrics"] if r["metric"] == "success_rate")
    assert (success["a"], success["b"]) == (0.5, 0.75) and success["p_value"] == 1.0   # two gained, one lost
    (stopped / "outcomes.json").unlink()
    with pytest.raises(SystemExit, match="holds neither demo-result.json nor outcomes.json"):
        kept.main([f"{stopped}:sft", f"{long}:sft"])


_entropy_spec = importlib.util.spec_from_file_location("sampled_entropy",
                                                       Path(__file__).parents[1] / "bench" / "sampled_entropy.py")
entropy = importlib.util.module_from_spec(_entropy_spec)
_entropy_spec.loader.exec_module(entropy)


def test_sampled_entropy_pairs_per_task_means_and_refuses_a_seed_without_its_store(tmp_path):
    # per task (summed surprisal, tokens): B is 0.1 nats/token above A on t0, 0.3 on t1; t2 is A's alone
    a = {"t0": (1.0, 10), "t1": (2.0, 10), "t2": (5.0, 1)}
    b = {"t0": (4.0, 20), "t1": (10.0, 20)}
    diff, ci = entropy.paired(a, b, n_boot=200)
    assert diff == pytest.approx(0.2) and ci[0] >= 0.1 - 1e-9 and ci[1] <= 0.3 + 1e-9
    with pytest.raises(SystemExit, match="no task has sampled tokens under both versions"):
        entropy.paired(a, {"t9": (1.0, 1)}, n_boot=10)
    home = _kept_seed(tmp_path / "kept", {"sft": [1]})
    with pytest.raises(SystemExit, match="needs demo-result.json and store.sqlite"):
        entropy.main([str(home)])


def test_prune_keeps_the_named_checkpoints_and_the_demonstrations_export_only_when_asked(tmp_path):
    for path in ("checkpoints/sft/config.json", "checkpoints/grpo1/config.json", "checkpoints/final/config.json",
                 "demo/shards/sft-run1/manifest.json", "demo/shards/grpo-run2/manifest.json",
                 "demo/tasks/files-seed1/taskgen.json", "demo/optimizer/t/grpo.pt"):
        (tmp_path / "a" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "a" / path).write_text("x")
    import shutil
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    curve.prune(tmp_path / "a", {"sft", "final"})
    left = sorted(str(p.relative_to(tmp_path / "a")) for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert left == ["checkpoints/final/config.json", "checkpoints/sft/config.json", "demo/shards/sft-run1/manifest.json"]
    curve.prune(tmp_path / "b", None)
    assert [p for p in (tmp_path / "b").rglob("*") if p.is_file()] == []


_ofs_spec = importlib.util.spec_from_file_location("outcomes_from_store",
                                                   Path(__file__).parents[1] / "bench" / "outcomes_from_store.py")
ofs = importlib.util.module_from_spec(_ofs_spec)
_ofs_spec.loader.exec_module(ofs)


def test_a_stopped_seeds_evaluation_runs_are_found_by_the_loops_names(tmp_path):
    from forge_store import Settings, open_store

    home = tmp_path / "seed0"
    with open_store(f"sqlite:///{home / 'store.sqlite'}", settings=Settings(home=home)) as store:
        ids = {name: store.create_run(name=name) for name in (
            "eval base (t1)", "eval sampled base (t1)", "eval sft (t1)", "validate sft (t1)", "eval sftx (t1)",
            "grpo round 1 sft (t1)")}
    greedy, sampled = ofs.eval_runs(home, {"base": "base", "sft": "sft"})
    assert greedy == {"base": ids["eval base (t1)"], "sft": ids["eval sft (t1)"]}   # not sftx's, not validate's
    assert sampled == {"base": ids["eval sampled base (t1)"]}   # sft ran no sampled evaluation
    with pytest.raises(SystemExit, match=r"final=grpo2: no run named 'eval grpo2 \(...\)'.* evaluated there are "
                                         r"base, sft, sftx$"):
        ofs.eval_runs(home, {"final": "grpo2"})
    with open_store(f"sqlite:///{home / 'store.sqlite'}", settings=Settings(home=home)) as store:
        store.create_run(name="eval sft (t2)")   # a second loop over the same store
    with pytest.raises(SystemExit, match="2 runs named 'eval sft"):
        ofs.eval_runs(home, {"sft": "sft"})
