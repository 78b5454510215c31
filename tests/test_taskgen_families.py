"""The generated families built for behaviour (``check``, ``recover``, ``plan``): every template's reference
solution reaches 1.0 (solve.sh, and actions.json through the react harness's own tool code), an untouched workspace
scores 0, and each family's trap is real: the natural command goes wrong silently (``check``), fails with an
informative error (``recover``) or leaves the plan unfinished (``plan``: no partial credit). No sandbox."""

from __future__ import annotations

import functools
import itertools
import json
import subprocess
from pathlib import Path

import pytest

from rollout import generate_tasks, load_task
from rollout._taskgen import FAMILIES, plan
from tests.test_example_tasks import Rollout
from tests.test_taskgen import _materialise as materialise
from tests.test_taskgen import _bash, replay

NEW = ("check", "recover", "plan")


@functools.cache
def _templates(family: str, seed: int, difficulty: int) -> tuple[str, ...]:
    return tuple(st.template for st in FAMILIES[family].draft(seed, difficulty).steps)


def _cases() -> list[tuple[str, int, int]]:
    out = []
    for family in NEW:
        mod = FAMILIES[family]
        for d in getattr(mod, "DIFFICULTIES", (1, 2, 3)):
            for t in sorted(mod.TEMPLATES):
                seed = next((s for s in range(3000) if t in _templates(family, s, d)), None)
                if seed is not None and (family, seed, d) not in out:
                    out.append((family, seed, d))
    return out


CASES = _cases()


def _materialise(root: Path, family: str, seed: int, difficulty: int) -> Path:
    return materialise(root, seed, difficulty, family=family)


@pytest.fixture
def make(tmp_path):
    n = itertools.count()

    def _make(family: str, seed: int, difficulty: int) -> Rollout:
        task = load_task(_materialise(tmp_path / "tasks", family, seed, difficulty))
        return Rollout(task, tmp_path / f"run-{next(n)}")
    return _make


def _run(r: Rollout, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], cwd=r.workspace, env=r.env, capture_output=True, text=True,
                          timeout=30)


@pytest.mark.parametrize("family, seed, difficulty", CASES, ids=[f"{f}-s{s}-d{d}" for f, s, d in CASES])
def test_reference_solutions_reach_1_and_untouched_scores_0(make, family, seed, difficulty):
    r = make(family, seed, difficulty)
    assert r.verify()["reward"] == 0.0
    r.solve()
    solved = r.verify()
    assert solved["reward"] == 1.0 and all(solved["checks"].values()), solved
    r2 = make(family, seed, difficulty)
    actions = r2.task.solution_actions
    assert len(actions) == difficulty + 1 and actions[-1] == {"answer": "Done."}
    outputs = replay(r2, actions)
    assert all(o.startswith(("exit code: 0", "wrote ")) for o in outputs), outputs
    assert r2.verify()["reward"] == 1.0


def test_every_template_of_every_new_family_is_covered():
    for family in NEW:
        seen = {t for f, s, d in CASES if f == family for t in _templates(f, s, d)}
        assert seen == set(FAMILIES[family].TEMPLATES), family


def _open_end_task(make, template: str, want_open: bool) -> Rollout:
    for seed in range(3000):
        st = FAMILIES["check"].draft(seed, 1).steps[0]
        if st.template == template and st.key[-1] is want_open:
            return make("check", seed, 1)
    raise AssertionError(f"no {template} task with open_end={want_open}")


def test_check_traps_exit_0_and_only_a_read_back_shows_them(make):
    """``echo l >> f`` on a file whose last line lacks its newline exits 0, scores 0 for that step, and ``cat``
    shows the glued line; on a file that ends with a newline the same command is right."""
    for want_open, reward in ((True, 0.0), (False, 1.0)):
        r = _open_end_task(make, "append_end", want_open)
        step = FAMILIES["check"].draft(r.task.config.metadata["seed"], 1).steps[0]
        _, f, line, _ = step.key
        p = _run(r, f"echo '{line}' >> {f}")
        assert p.returncode == 0 and p.stderr == ""
        assert r.verify()["reward"] == reward
        shown = _run(r, f"cat {f}").stdout
        assert (line + "\n" in shown.splitlines(keepends=True)) is (not want_open), shown


def test_check_counts_and_joins_go_wrong_silently_on_an_open_last_line(make):
    seeds = {t: next(s for s in range(3000) if (st := FAMILIES["check"].draft(s, 1).steps[0]).template == t
                     and st.key[-1] is True) for t in ("count_all", "join")}
    r = make("check", seeds["count_all"], 1)
    _, src, dst, _ = FAMILIES["check"].draft(seeds["count_all"], 1).steps[0].key
    assert _run(r, f"wc -l < {src} > {dst}").returncode == 0 and r.verify()["reward"] == 0.0
    r = make("check", seeds["join"], 1)
    _, a, b, c, _ = FAMILIES["check"].draft(seeds["join"], 1).steps[0].key
    assert _run(r, f"cat {a} {b} > {c}").returncode == 0 and r.verify()["reward"] == 0.0
    r = make("check", next(s for s in range(3000) if FAMILIES["check"].draft(s, 1).steps[0].template
                           == "two_lines"), 1)
    _, f, x, y = FAMILIES["check"].draft(r.task.config.metadata["seed"], 1).steps[0].key
    assert _run(r, f'echo "{x}\\n{y}" > {f}').returncode == 0 and r.verify()["reward"] == 0.0


def test_recover_natural_commands_fail_with_informative_errors_and_the_fix_scores_1(make):
    seed = next(s for s in range(3000) if (st := FAMILIES["recover"].draft(s, 1).steps[0]).template == "into_folder"
                and st.key[-1] is False)
    r = make("recover", seed, 1)
    _, f, folder, _ = FAMILIES["recover"].draft(seed, 1).steps[0].key
    p = _run(r, f"mv {f} {folder}/")
    assert p.returncode != 0 and "Not a directory" in p.stderr
    assert r.verify()["reward"] == 0.0
    _bash(r, f"mkdir {folder} && mv {f} {folder}/")
    assert r.verify()["reward"] == 1.0

    seed = next(s for s in range(3000) if FAMILIES["recover"].draft(s, 1).steps[0].template == "locate"
                and FAMILIES["recover"].draft(s, 1).steps[0].key[2] == "delete")
    r = make("recover", seed, 1)
    _, f, _, home = FAMILIES["recover"].draft(seed, 1).steps[0].key
    p = _run(r, f"rm {f}")
    assert p.returncode != 0 and "No such file or directory" in p.stderr
    found = _run(r, f"find . -name {f}").stdout.strip()
    assert found == f"./{home}/{f}"
    _bash(r, f"rm {found}")
    assert r.verify()["reward"] == 1.0


def test_plan_is_all_or_nothing_and_order_matters(make):
    seed = next(s for s in range(3000) if "append" in _templates("plan", s, 4))
    r = make("plan", seed, 4)
    actions = [a["arguments"]["command"] for a in r.task.solution_actions if "tool" in a]
    _bash(r, "\n".join(actions[:-1]))
    assert r.verify()["reward"] == 0.0, "three steps of four earn nothing"
    r = make("plan", seed, 4)
    order = actions[:]
    i = next(k for k, c in enumerate(order) if c.startswith("echo"))
    order[i], order[-1] = order[-1], order[i]   # count before the append
    _bash(r, "\n".join(order))
    assert r.verify()["reward"] == 0.0
    r = make("plan", seed, 4)
    _bash(r, "\n".join(actions))
    result = r.verify()
    assert result["reward"] == 1.0
    assert sorted(k for k in result["checks"] if not k.startswith("guard_")) == ["step1_every_step"]


def test_each_family_generates_splits_with_its_own_difficulties(tmp_path):
    for family in NEW:
        paths = generate_tasks(family, tmp_path / family, train=6, heldout=3, seed=1)
        tasks = [load_task(p) for p in paths]
        assert [t.config.metadata["split"] for t in tasks] == ["train"] * 6 + ["heldout"] * 3
        want = set(getattr(FAMILIES[family], "DIFFICULTIES", (1, 2, 3)))
        assert {t.config.metadata["difficulty"] for t in tasks} == want
        manifest = json.loads((tmp_path / family / "taskgen.json").read_text())
        assert manifest["family"] == family and manifest["difficulties"] == sorted(want)
        keys = {tuple(map(str, FAMILIES[family].draft(t["seed"], t["difficulty"]).key)) for t in manifest["tasks"]}
        assert len(keys) == 9
    assert plan("plan", train=2, heldout=0, seed=0).tasks[0]["template"].startswith("to_folder+")
