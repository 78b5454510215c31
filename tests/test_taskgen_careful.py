"""The careful reference solution (``generate_tasks(careful=...)``): on ``check`` and ``recover`` steps the scripted
teacher may play a solution that knows nothing the workspace hides. It looks at the file's last byte before acting
(``check``), or runs the natural command, meets the error and recovers (``recover``). What it looks at or meets
must decide what it does next; the verifier must give it 1.0; a generation with ``careful=0`` is byte for byte the
generation before the option. No sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout import generate_tasks, load_task
from rollout._taskgen import FAMILIES, TaskGenError, plan
from rollout._taskgen._render import render, task_id
from tests.test_example_tasks import Rollout
from tests.test_taskgen import _digest, replay
from tests.test_taskgen_families import CASES

HIDING = [c for c in CASES if c[0] in ("check", "recover")]
LOOKS = ("append_end", "join", "count_all")
MKDIR = ("into_folder", "copy_into", "save_into")


def _materialise(root: Path, family: str, seed: int, difficulty: int, careful: float) -> Path:
    d = root / task_id(family, seed, difficulty)
    for rel, (content, executable) in render(FAMILIES[family].draft(seed, difficulty), family=family, seed=seed,
                                             split="train", answer="Done.", careful=careful).items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content)
        p.chmod(0o755 if executable else 0o644)
    return d


@pytest.mark.parametrize("family, seed, difficulty", HIDING, ids=[f"{f}-s{s}-d{d}" for f, s, d in HIDING])
def test_careful_solutions_act_on_what_they_saw_and_reach_1(tmp_path, family, seed, difficulty):
    task = load_task(_materialise(tmp_path / "tasks", family, seed, difficulty, careful=1.0))
    steps = FAMILIES[family].draft(seed, difficulty).steps
    actions = list(task.solution_actions)
    assert actions[:-1] == [a for s in steps for a in (s.careful or s.actions)] and actions[-1] == {"answer": "Done."}
    r = Rollout(task, tmp_path / "run")
    outputs = replay(r, actions)
    assert r.verify()["reward"] == 1.0, outputs
    at = 0
    for s in steps:
        seen, at = outputs[at:at + len(s.careful or s.actions)], at + len(s.careful or s.actions)
        if s.template in LOOKS:        # the look prints 0 for a last line without its newline, 1 with one
            open_end = s.key[-1]
            assert seen[0].startswith("exit code: 0\nstdout:\n" + ("0" if open_end else "1") + "\n"), seen
        elif s.template in MKDIR:      # the natural command fails only where the folder is missing, then mkdir
            exists = s.key[-1]
            assert len(seen) == (1 if exists else 2), seen
            assert seen[0].startswith("exit code: 0") is exists and seen[-1].startswith("exit code: 0"), seen
        elif s.template == "locate":   # the bare name fails; find prints the path the last command acts on
            _, f, _, home = s.key
            assert not seen[0].startswith("exit code: 0") and "No such file or directory" in seen[0], seen
            assert f"stdout:\n./{home}/{f}\n" in seen[1] and seen[2].startswith("exit code: 0"), seen
        else:
            assert s.careful is None and seen[0].startswith(("exit code: 0", "wrote ")), seen


def test_the_look_differs_between_the_two_hidden_states(tmp_path):
    """The same template with and without a newline at the end: the privileged commands differ, the careful look is
    the same command, and its output tells the two apart (so the student can condition on it)."""
    by_state = {}
    for seed in range(3000):
        st = FAMILIES["check"].draft(seed, 1).steps[0]
        if st.template == "append_end":
            by_state.setdefault(st.key[-1], seed)
        if len(by_state) == 2:
            break
    looks = {}
    for open_end, seed in by_state.items():
        task = load_task(_materialise(tmp_path / str(open_end), "check", seed, 1, careful=1.0))
        r = Rollout(task, tmp_path / f"run-{open_end}")
        looks[open_end] = replay(r, task.solution_actions[:1])[0]
        assert r.verify()["reward"] == 0.0, "the look alone changes nothing"
    assert looks[True] != looks[False]


# digests (tests.test_taskgen._digest) of plan(family, train=12, heldout=4, seed=3) computed at b31b75a, the commit
# before the careful option: at careful=0 a generation must still be those bytes
BEFORE_CAREFUL = {"check": "382ad042a9686529d35ac3392454509852f0ec4933f2196cf445d356dea942f9",
                  "recover": "c9e4dd767a33574851dcb80e85a7295d397e776ccf173081c9e55a9d472e8d65"}


def test_careful_0_is_the_generation_before_the_option_and_the_share_is_per_step():
    for family, digest in BEFORE_CAREFUL.items():
        p = plan(family, train=12, heldout=4, seed=3, careful=0.0)
        assert _digest(p.tree) == digest, f"careful=0 changed the bytes of the {family} generation"
        assert "careful" not in json.loads(p.tree["taskgen.json"][0])
    half = plan("check", train=60, heldout=0, seed=3, careful=0.5)
    assert json.loads(half.tree["taskgen.json"][0])["careful"] == 0.5
    looked = hiding = 0
    for t in half.tasks:
        steps = FAMILIES["check"].draft(t["seed"], t["difficulty"]).steps
        acts = json.loads(half.tree[f"train/{t['id']}/solution/actions.json"][0])[:-1]
        at = 0
        for s in steps:
            careful = s.careful is not None and acts[at:at + len(s.careful)] == s.careful
            at += len(s.careful) if careful else len(s.actions)
            looked += careful
            hiding += s.careful is not None
        assert at == len(acts)
    assert 0.35 < looked / hiding < 0.65, (looked, hiding)
    # the files family hides nothing: careful changes none of its task bytes
    files0, files1 = plan("files", train=12, heldout=4, seed=3), plan("files", train=12, heldout=4, seed=3, careful=1.0)
    assert {k: v for k, v in files1.tree.items() if k != "taskgen.json"} == \
        {k: v for k, v in files0.tree.items() if k != "taskgen.json"}


def test_a_careful_generation_does_not_overwrite_another(tmp_path):
    generate_tasks("recover", tmp_path / "g", train=4, heldout=0, seed=1)
    with pytest.raises(TaskGenError, match="another generation"):
        generate_tasks("recover", tmp_path / "g", train=4, heldout=0, seed=1, careful=1.0)


@pytest.mark.parametrize("bad", [-0.1, 1.5, "half", True, None])
def test_careful_out_of_range_is_refused_with_the_rule(bad):
    with pytest.raises(TaskGenError, match=r"--careful .*from 0 to 1"):
        plan("check", train=2, heldout=0, seed=0, careful=bad)


def test_the_loop_generates_a_careful_generation_in_a_folder_of_its_own(tmp_path):
    from rich.console import Console

    from openforge.loop import LearningLoop, LoopConfig, LoopError

    quiet = Console(file=open("/dev/null", "w"))
    plain = LearningLoop(LoopConfig(out=tmp_path, train_tasks=8, demo_tasks=8, heldout_tasks=4, tag="t"), quiet)
    _, plain_demos, _ = plain.tasks()
    careful = LearningLoop(LoopConfig(out=tmp_path, train_tasks=8, demo_tasks=8, heldout_tasks=4, careful=1.0,
                                      tag="t"), quiet)
    _, demos, heldout = careful.tasks()
    assert (tmp_path / "tasks" / "check-seed0").is_dir() and (tmp_path / "tasks" / "check-seed0-careful1").is_dir()
    assert [t.path.name for t in demos] == [t.path.name for t in plain_demos]   # the same tasks, other solutions
    looked = [t for t in demos if t.config.metadata["family"] == "check"
              and any("tail -c 1" in a.get("arguments", {}).get("command", "") for a in t.solution_actions)]
    plain_looked = [t for t in plain_demos if any("tail -c 1" in a.get("arguments", {}).get("command", "")
                                                  for a in t.solution_actions)]
    assert looked and not plain_looked
    assert heldout and all(t.config.metadata["split"] == "heldout" for t in heldout)
    with pytest.raises(LoopError, match=r"--careful 2: a share of steps, from 0 to 1"):
        LoopConfig(out=tmp_path, careful=2).check()
