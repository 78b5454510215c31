"""Generated tasks (rollout.generate_tasks, the `files` family): every template at every difficulty is solved to
1.0 by its solve.sh and by its actions.json replayed through the react harness's own tool code; an untouched
workspace scores 0; near misses score the documented partial credit; hostile end states score nothing; the same
seed gives the same bytes; train and held-out never share an instruction. No sandbox (as test_example_tasks)."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rollout import TaskGenError, generate_tasks, load_task, load_tasks, task_families
from rollout._harnesses import react_agent
from rollout._taskgen import files as files_family
from rollout._taskgen import FAMILIES, plan, split_of
from rollout._taskgen._render import render, task_id
from tests.test_example_tasks import Rollout

TEMPLATES = sorted(files_family.TEMPLATES)


@functools.cache
def _templates(seed: int, difficulty: int) -> tuple[str, ...]:
    return tuple(st.template for st in files_family.draft(seed, difficulty).steps)


def _seeds_with(template: str, difficulty: int, n: int) -> list[int]:
    """The first ``n`` seeds whose task of this difficulty uses ``template``."""
    found = list(itertools.islice((s for s in range(2000) if template in _templates(s, difficulty)), n))
    assert len(found) == n, (template, difficulty)
    return found


CASES = [(t, d, s) for d in (1, 2, 3) for t in TEMPLATES for s in _seeds_with(t, d, 2 if d == 1 else 1)]


def _materialise(root: Path, seed: int, difficulty: int, split: str = "train", family: str = "files") -> Path:
    """One generated task of ``family`` written out, without the generator's CLI (its tests are below)."""
    d = root / task_id(family, seed, difficulty)
    for rel, (content, executable) in render(FAMILIES[family].draft(seed, difficulty), family=family, seed=seed,
                                             split=split, answer="Done.").items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content)
        p.chmod(0o755 if executable else 0o644)
    return d


@pytest.fixture
def make(tmp_path):
    """A fresh workspace of the task (seed, difficulty) each call."""
    n = itertools.count()

    def _make(seed: int, difficulty: int) -> Rollout:
        task = load_task(_materialise(tmp_path / "tasks", seed, difficulty))
        return Rollout(task, tmp_path / f"run-{next(n)}")
    return _make


def _bash(r: Rollout, script: str) -> None:
    p = subprocess.run(["bash", "-c", "set -e\n" + script], cwd=r.workspace, env=r.env, capture_output=True,
                       timeout=30)
    assert p.returncode == 0, p.stderr.decode()


def replay(r: Rollout, actions) -> list[str]:
    """Run tool calls as the react harness does: its own run_tool, in a python3 whose cwd is the workspace."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from react_agent import run_tool; "
            "print(json.dumps([run_tool(a['tool'], a['arguments']) for a in json.load(sys.stdin) if 'tool' in a]))")
    p = subprocess.run(["python3", "-c", code, str(Path(react_agent.__file__).parent)], cwd=r.workspace, env=r.env,
                       input=json.dumps(list(actions)).encode(), capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    return json.loads(p.stdout)


@pytest.mark.parametrize("template, difficulty, seed", CASES, ids=[f"{t}-d{d}-s{s}" for t, d, s in CASES])
def test_reference_solution_and_actions_reach_1_and_untouched_scores_0(make, template, difficulty, seed):
    r = make(seed, difficulty)
    untouched = r.verify()
    assert untouched["reward"] == 0.0 and not untouched["details"]["failed_guards"], untouched
    r.solve()
    solved = r.verify()
    assert solved["reward"] == 1.0 and all(solved["checks"].values()), solved
    assert r.verify() == solved, "the verifier is not deterministic"

    r2 = make(seed, difficulty)
    actions = r2.task.solution_actions
    assert len(actions) == difficulty + 1 and actions[-1] == {"answer": "Done."}
    outputs = replay(r2, actions)
    assert all(o.startswith(("exit code: 0", "wrote ")) for o in outputs), outputs
    assert r2.verify() == solved


def test_every_template_and_difficulty_is_covered():
    assert {(t, d) for t, d, _ in CASES} == {(t, d) for t in TEMPLATES for d in (1, 2, 3)}
    assert set(TEMPLATES) == {"append", "copy", "count", "create", "delete", "move_into", "rename", "replace"}


@pytest.mark.parametrize("difficulty", [2, 3])
def test_doing_only_some_steps_earns_their_share(make, difficulty):
    for seed in range(4):
        r = make(seed, difficulty)
        for done, action in enumerate(r.task.solution_actions[:difficulty - 1], 1):
            replay(r, [action])
            assert r.verify()["reward"] == round(done / difficulty, 4)


def _task_with(make, template: str, difficulty: int = 1) -> Rollout:
    return make(_seeds_with(template, difficulty, 1)[0], difficulty)


@pytest.mark.parametrize("template, mistake, reward", [
    ("rename", lambda a: a.replace("mv ", "cp "), 0.5),                 # copied, not moved
    ("move_into", lambda a: a.replace("&& mv ", "&& cp "), 0.5),
    ("count", lambda a: a.replace("wc -l < ", "wc -l "), 0.0),          # "5 notes.txt" is not the number
    ("replace", lambda a: a.replace("sed -i ", "sed "), 0.0),           # printed, not changed
    ("append", lambda a: a.replace(">>", ">"), 0.0),                    # overwrote the file
    ("copy", lambda a: a.replace("cp ", "mv "), 0.0),                   # the source had to stay: a guard
    ("create", lambda a: a.replace("' > ", " ' > "), 0.0),                # a trailing space in the line
    ("create", lambda a: a + ".bak", 0.0),                              # the wrong file name
])
def test_near_misses_score_partial_credit_or_none(make, template, mistake, reward):
    for seed in _seeds_with(template, 1, 3):
        r = make(seed, 1)
        action = r.task.solution_actions[0]
        if action["tool"] == "write_file":
            a = action["arguments"]
            action = {"command": f"printf '%s\\n' '{a['content'].strip()}' > {a['path']}"}
        else:
            action = action["arguments"]
        _bash(r, mistake(action["command"]))
        assert r.verify()["reward"] == reward, (template, seed)


def _names(instruction: str) -> list[str]:
    return re.findall(r"\b[a-z]+_\d+\.(?:txt|md|log)\b", instruction)


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_hostile_end_states_earn_nothing(make, difficulty):
    for seed in range(6):
        r = make(seed, difficulty)
        names = _names(r.task.instruction)
        assert names, r.task.instruction
        _bash(r, "".join(f"echo junk > {n}\n" for n in names))          # junk into every file it names
        assert r.verify()["reward"] == 0.0, r.task.instruction
        r = make(seed, difficulty)
        _bash(r, "rm -rf ./*")                                            # everything gone: a guard fails
        assert r.verify()["reward"] == 0.0


def test_symlinks_fifos_and_huge_files_do_not_count(make):
    r = _task_with(make, "create")
    r.solve()
    (path,) = [a["arguments"]["path"] for a in r.task.solution_actions if a.get("tool") == "write_file"]
    _bash(r, f"mv {path} .real && ln -s .real {path}")                    # right content, behind a symlink
    assert r.verify()["reward"] == 0.0
    _bash(r, f"rm {path} && mkfifo {path}")                               # would block a naive open()
    assert r.verify()["reward"] == 0.0
    _bash(r, f"rm {path} && (cat .real; head -c 70000 /dev/zero | tr '\\0' x) > {path}")
    assert r.verify()["reward"] == 0.0
    r = _task_with(make, "move_into")
    r.solve()
    folder = r.task.solution_actions[0]["arguments"]["command"].split()[2]
    _bash(r, f"mv {folder} .d && ln -s .d {folder}")                      # a symlinked folder on the way
    assert r.verify()["reward"] == 0.0


# --- generation: seeds, splits, lineage, the output folder -------------------------------------------------------

def _digest(tree: dict) -> str:
    h = hashlib.sha256()
    for rel, (content, executable) in sorted(tree.items()):
        h.update(f"{rel}\0{int(executable)}\0".encode() + hashlib.sha256(content).digest())
    return h.hexdigest()


def test_same_seed_same_bytes_other_seed_other_tasks():
    a = plan("files", train=12, heldout=4, seed=7)
    assert _digest(a.tree) == _digest(plan("files", train=12, heldout=4, seed=7).tree)
    b = plan("files", train=12, heldout=4, seed=8)
    assert not {t["id"] for t in a.tasks} & {t["id"] for t in b.tasks}


PINNED_DIGEST = "731d842432958ab654890d5e9efd7ae90218beba1931b5097ea0f5225a432ad9"


def test_generation_bytes_are_pinned():
    """Same seed, same bytes across commits too: a change to what a seed generates must bump GENERATOR (task ids
    would otherwise name other bytes in stores that already hold them) and update this digest."""
    p = plan("files", train=6, heldout=3, seed=0)
    assert json.loads(p.tree["taskgen.json"][0])["generator"] == "openforge.taskgen/1"
    assert _digest(p.tree) == PINNED_DIGEST



def test_splits_are_disjoint_prefix_stable_and_evenly_mixed(tmp_path):
    paths = generate_tasks("files", tmp_path / "set", train=60, heldout=30, seed=1)
    train, held = load_tasks(tmp_path / "set" / "train"), load_tasks(tmp_path / "set" / "heldout")
    assert [t.path for t in train + held] == [p.resolve() for p in paths] and (len(train), len(held)) == (60, 30)
    assert not {t.instruction for t in train} & {t.instruction for t in held}
    assert len({t.instruction for t in train}) == 60 and len({t.instruction for t in held}) == 30
    for split, tasks in (("train", train), ("heldout", held)):
        assert [t.config.metadata["difficulty"] for t in tasks] == [1, 2, 3] * (len(tasks) // 3)
        for t in tasks:
            m = t.config.metadata
            assert m["generator"] == "openforge.taskgen/1" and m["family"] == "files" and m["split"] == split
            assert m["template"] == "+".join(m["steps"]) and len(m["steps"]) == m["difficulty"]
            assert t.id == f"files-{m['seed']}-d{m['difficulty']}" and t.config.task.reference_steps == m["difficulty"]
            assert t.store_metadata()["metadata"]["seed"] == m["seed"]
            assert len(t.solution_actions) == m["difficulty"] + 1
            assert t.agent_timeout_s <= 360 and t.verifier_timeout_s <= 30
            key = tuple(files_family.draft(m["seed"], m["difficulty"]).key)
            assert split_of("files", key) == split
    small = plan("files", train=10, heldout=2, seed=1)
    assert [t["id"] for t in small.tasks if t["split"] == "train"] == [t.id for t in train[:10]]
    templates = {s for t in train for s in t.config.metadata["steps"]}
    assert templates == set(TEMPLATES)


def test_instructions_are_short_and_worded_variously():
    p = plan("files", train=90, heldout=0, seed=2)
    texts = {rel: c.decode() for rel, (c, _) in p.tree.items() if rel.endswith("instruction.md")}
    assert max(len(t) for t in texts.values()) < 330
    single = [t for t in texts.values() if "\n1." not in t]
    openings = {" ".join(t.split()[:2]) for t in single}
    assert len(openings) >= 12, openings     # three wordings per template


def test_an_existing_folder_is_reused_only_when_identical(tmp_path):
    out = tmp_path / "set"
    first = generate_tasks("files", out, train=3, heldout=1, seed=5)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    assert generate_tasks("files", out, train=3, heldout=1, seed=5) == first
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before, "an identical generation rewrote files"
    with pytest.raises(TaskGenError, match=r"another generation \(family files, seed 5, train 3, heldout 1.*"
                                           r"delete .*set to regenerate"):
        generate_tasks("files", out, train=3, heldout=1, seed=6)
    (first[0] / "instruction.md").write_text("edited\n")
    with pytest.raises(TaskGenError, match="instruction.md"):
        generate_tasks("files", out, train=3, heldout=1, seed=5)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(TaskGenError, match="not a task generation"):
        generate_tasks("files", other, train=1, seed=5)
    assert (other / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("kwargs, message", [
    ({"family": "shell"}, "task family 'shell' is unknown; known families: check, files, plan, recover"),
    ({"train": -1}, "--train -1"),
    ({"train": 0, "heldout": 0}, "nothing to generate"),
    ({"difficulties": (4,)}, "tasks of 1 to 3 steps"),
    ({"seed": -3}, "--seed -3"),
])
def test_bad_requests_say_what_to_do(tmp_path, kwargs, message):
    args = {"family": "files", "train": 2, "heldout": 0} | kwargs
    with pytest.raises(TaskGenError, match=re.escape(message)):
        generate_tasks(args.pop("family"), tmp_path / "x", **args)
    assert not (tmp_path / "x").exists()


def test_families_list_their_templates():
    families = task_families()
    assert list(families) == ["check", "files", "plan", "recover"] and families["files"] == TEMPLATES


def test_the_command_generates_and_refuses(tmp_path):
    exe = str(Path(sys.executable).parent / "openforge")
    env = {**os.environ, "OPENFORGE_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    args = [exe, "tasks", "generate", "--family", "files", "--train", "4", "--heldout", "2", "--seed", "3",
            "--difficulty", "1,2", "--out", str(tmp_path / "set")]
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert f"wrote 4 train tasks in {tmp_path / 'set' / 'train'} (2 x 1 step, 2 x 2 steps)" in p.stdout
    assert "wrote 2 heldout tasks" in p.stdout and "taskgen.json" in p.stdout
    assert len(load_tasks(tmp_path / "set" / "train")) == 4
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and "unchanged" in p.stdout
    p = subprocess.run(["4" if a == "3" else a for a in args], capture_output=True, text=True, env=env,
                       timeout=120)    # another --seed, same --out
    assert p.returncode == 2 and "another generation" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_the_doc_lists_every_template():
    doc = (Path(__file__).resolve().parents[1] / "examples" / "generated-tasks.md").read_text()
    for family, templates in task_families().items():
        assert f"`{family}`" in doc
        assert all(f"| `{t}` |" in doc for t in templates), [t for t in templates if f"| `{t}` |" not in doc]
