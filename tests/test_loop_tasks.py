"""Which train tasks the loop's teacher demonstrates: the even split, ``--demo-mix`` weights and
``--demo-min-steps``, on tasks the real generator makes."""

from __future__ import annotations

import pytest

from openforge.loop_tasks import DemoMixError, parse_mix, shares

FAMS = ("files", "check", "recover", "plan")


def test_even_weights_give_the_old_split_first_families_one_more():
    assert shares(48, FAMS, {}) == {"files": 12, "check": 12, "recover": 12, "plan": 12}
    assert shares(10, FAMS, {}) == {"files": 3, "check": 3, "recover": 2, "plan": 2}
    assert shares(3, FAMS, {}) == {"files": 1, "check": 1, "recover": 1, "plan": 0}


def test_weights_share_the_total_by_largest_remainder():
    assert shares(48, FAMS, parse_mix("check=2,recover=2")) == {"files": 8, "check": 16, "recover": 16, "plan": 8}
    got = shares(50, FAMS, {"check": 3})   # 50/6 = 8.33 a weight: 8.33, 25, 8.33, 8.33
    assert got == {"files": 9, "check": 25, "recover": 8, "plan": 8} and sum(got.values()) == 50
    assert shares(12, FAMS, {"files": 0, "plan": 0}) == {"files": 0, "check": 6, "recover": 6, "plan": 0}


@pytest.mark.parametrize("text, says", [
    ("check", "is not FAMILY=WEIGHT"), ("check=two", "is not FAMILY=WEIGHT"), ("check=-1", "is not FAMILY=WEIGHT"),
    ("=2", "is not FAMILY=WEIGHT"), ("check=nan", "is not FAMILY=WEIGHT"), ("check=inf", "is not FAMILY=WEIGHT"),
])
def test_a_bad_mix_says_the_form(text, says):
    with pytest.raises(DemoMixError, match=says):
        parse_mix(text)


def test_a_mix_naming_another_family_or_weighing_all_zero_is_refused(tmp_path):
    from openforge.loop import LoopConfig

    with pytest.raises(DemoMixError, match="names chekc, not among the loop's families"):
        LoopConfig(out=tmp_path, demo_mix=parse_mix("chekc=2")).check()
    with pytest.raises(DemoMixError, match="every family weight 0"):
        shares(4, ("check",), {"check": 0})
    assert parse_mix(" check = 2 , ") == {"check": 2.0}


def test_the_loop_demonstrates_the_mix_of_multi_step_tasks(tmp_path):
    from rich.console import Console

    from openforge.loop import LearningLoop, LoopConfig, LoopError

    quiet = Console(file=open("/dev/null", "w"))
    even = LearningLoop(LoopConfig(out=tmp_path, train_tasks=48, demo_tasks=12, heldout_tasks=4, tag="t"), quiet)
    train, even_demos, _ = even.tasks()
    steps = lambda tasks, fam: [t.config.metadata["difficulty"] for t in tasks  # noqa: E731
                                if t.config.metadata["family"] == fam]
    assert steps(even_demos, "check") == [1, 2, 3]   # the family's first train tasks, each difficulty once
    mixed = LearningLoop(LoopConfig(out=tmp_path, train_tasks=48, demo_tasks=12, heldout_tasks=4, tag="t",
                                    demo_mix={"check": 2, "recover": 2}, demo_min_steps=2), quiet)
    mixed_train, demos, _ = mixed.tasks()
    assert [t.path for t in mixed_train] == [t.path for t in train]   # the same train tasks, other demonstrations
    assert len(steps(demos, "check")) == len(steps(demos, "recover")) == 4
    assert len(steps(demos, "files")) == len(steps(demos, "plan")) == 2
    assert all(d >= 2 for d in steps(demos, "check") + steps(demos, "recover") + steps(demos, "files"))
    assert set(steps(demos, "check")) == {2, 3} and all(t in train for t in demos)
    with pytest.raises(DemoMixError, match=r"the check family has 8 train tasks of 2 or more steps, and the "
                                           r"demonstrations want 9 of them; raise --train-tasks"):
        LearningLoop(LoopConfig(out=tmp_path, train_tasks=48, demo_tasks=24, heldout_tasks=4, tag="t",
                                demo_mix={"check": 2}, demo_min_steps=2), quiet).tasks()
    with pytest.raises(LoopError, match="--demo-min-steps 0: pass 1"):
        LoopConfig(out=tmp_path, demo_min_steps=0).check()


@pytest.mark.parametrize("args, says", [
    (["--demo-mix", "chekc=2"], "--demo-mix names chekc, not among the loop's families"),
    (["--demo-mix", "check:2"], "'check:2' is not FAMILY=WEIGHT"),
    (["--demo-min-steps", "0"], "--demo-min-steps 0: pass 1"),
])
def test_the_demo_command_refuses_a_bad_mix_before_it_starts_anything(tmp_path, monkeypatch, args, says):
    from typer.testing import CliRunner

    from openforge.cli import build_app

    monkeypatch.setenv("OPENFORGE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "250")
    res = CliRunner().invoke(build_app(), ["demo", *args])
    assert res.exit_code == 2 and says in " ".join(res.output.split())
    assert not (tmp_path / "home" / "demo" / "tasks").exists()   # nothing generated, no engine started


def test_grpo_draws_every_difficulty_early_whichever_tasks_the_demonstrations_took(tmp_path):
    from rich.console import Console

    from openforge.loop import LearningLoop, LoopConfig
    from openforge.loop_tasks import grpo_pool

    quiet = Console(file=open("/dev/null", "w"))
    cfg = dict(out=tmp_path, train_tasks=96, demo_tasks=24, heldout_tasks=4, tag="t")
    train, demos, _ = LearningLoop(LoopConfig(**cfg), quiet).tasks()
    # even demonstrations: the order the train tasks had, the undemonstrated first
    assert grpo_pool(train, demos) == [t for t in train if t not in demos] + [t for t in train if t in demos]
    train, demos, _ = LearningLoop(LoopConfig(**cfg, demo_mix={"check": 2, "recover": 2}, demo_min_steps=2),
                                   quiet).tasks()
    pool = grpo_pool(train, demos)
    first = [t.config.metadata for t in pool[:12]]   # three draws of four: every family, every difficulty
    for family in ("check", "recover", "files"):
        assert sorted(m["difficulty"] for m in first if m["family"] == family) == [1, 2, 3], family
    assert sorted(pool, key=id) == sorted(train, key=id) and pool[len(train) - len(demos):] == \
        [t for t in train if t in demos]
    # what the pool was before: the head of the undemonstrated check tasks all one-step
    head = [t.config.metadata["difficulty"] for t in train if t not in demos
            and t.config.metadata["family"] == "check"][:3]
    assert head == [1, 1, 1]


def test_a_round_counts_what_it_drew_and_kept_by_family_and_steps(tmp_path):
    """The draws' counts by kind (the result's ``draws`` and the loop's console line), on the real generator's tasks:
    the kinds come from each task's metadata, the groups from the rollouts' results."""
    from rich.console import Console

    from openforge.loop import LearningLoop, LoopConfig
    from openforge.loop_recipe import GrpoRecipe
    from openforge.loop_sampling import RoundSampler
    from openforge.loop_tasks import grpo_pool, task_kind
    from tests.test_loop_sampling import FakeRun, result

    quiet = Console(file=open("/dev/null", "w"))
    train, demos, _ = LearningLoop(LoopConfig(out=tmp_path, train_tasks=48, demo_tasks=12, heldout_tasks=4,
                                              tag="t"), quiet).tasks()
    pool = grpo_pool(train, demos)
    mixed = {t.id for t in pool[:8] if t.config.metadata["family"] != "files"}   # groups with a spread of reward

    def rollouts(tasks, name):
        run = FakeRun(f"run-{name[-1]}")
        for t in tasks:
            g = f"{t.id}/{run.run_id}"
            run.results += [result(g, "success" if t.id in mixed else "failure", float(t.id in mixed)),
                            result(g, "failure", 0.0)]
        return run

    recipe = GrpoRecipe(tasks_per_round=4, group_size=2, signal_groups=3, max_draws=2)
    draws = RoundSampler(pool, recipe).draw(rollouts, "r")
    drawn = [task_kind(t) for t in pool[:len(draws.runs) * 4]]
    kept = [task_kind(t) for t in pool[:8] if t.id in mixed][:3]
    assert set(drawn) >= {"files 1-step", "check 1-step"} and "other" not in drawn
    out = draws.as_dict()
    assert out["drawn_by_kind"] == {k: drawn.count(k) for k in sorted(set(drawn))}
    assert out["kept_by_kind"] == {k: kept.count(k) for k in sorted(set(kept))}
    assert sum(out["spread_by_kind"].values()) == len(draws.spread) >= 3
    assert draws.kept_text() == ", ".join(f"{k} {kept.count(k)}" for k in sorted(set(kept)))
    assert task_kind("a plain task") == "other"
