"""The task format: good folders load; every malformed one is an error that names the file and the field."""

from __future__ import annotations

import json

import pytest

from rollout._task import TaskError, load_task, load_tasks


def _task(tmp_path, name="t1", toml="", instruction="Do it.", test_sh="echo 1 > $OPENFORGE_REWARD_DIR/reward.txt"):
    d = tmp_path / name
    (d / "tests").mkdir(parents=True)
    (d / "task.toml").write_text(toml)
    if instruction is not None:
        (d / "instruction.md").write_text(instruction)
    if test_sh is not None:
        (d / "tests" / "test.sh").write_text(test_sh)
    return d


def test_defaults_and_harbor_sections_load(tmp_path):
    d = _task(tmp_path, toml="""
version = "1.0"
[metadata]
author_name = "x"
difficulty = "easy"
category = "files"
[verifier]
timeout_sec = 30.0
[agent]
timeout_sec = 90
[environment]
docker_image = "python:3.11-slim"
memory_mb = 512
[[environment.services]]
name = "api"
command = "python3 /environment/api.py"
port = 8025
[task]
required_tools = ["bash"]
reference_steps = 3
""")
    t = load_task(d)
    assert (t.id, t.domain, t.agent_timeout_s, t.verifier_timeout_s) == ("t1", "files", 90, 30)
    assert t.config.environment.services[0].command == ["/bin/sh", "-c", "python3 /environment/api.py"]
    meta = t.store_metadata()
    assert meta["required_tools"] == ["bash"] and meta["reference_steps"] == 3
    assert len(t.verifier_hash) == 64 and len(t.instruction_hash) == 64


@pytest.mark.parametrize("toml, field", [
    ("[agent]\ntimeout_secs = 3\n", "agent.timeout_secs"),
    ("[agent]\ntimeout_sec = -1\n", "agent.timeout_sec"),
    ("[environment]\nmemory_mb = 'lots'\n", "environment.memory_mb"),
    ("[environment]\nworkdir = 'relative/dir'\n", "environment.workdir"),
    ("[task]\nreference_steps = 0\n", "task.reference_steps"),
    ("[task]\nid = 'has space'\n", "task.id"),
    ("[[environment.services]]\nname = 'x'\n", "environment.services.0.command"),
    ("surprise = 1\n", "surprise"),
])
def test_bad_fields_name_file_and_field(tmp_path, toml, field):
    d = _task(tmp_path, toml=toml)
    with pytest.raises(TaskError) as e:
        load_task(d)
    msg = str(e.value)
    assert str(d / "task.toml") in msg and f"`{field}`" in msg, msg


def test_bad_toml_syntax(tmp_path):
    d = _task(tmp_path, toml="[agent\ntimeout_sec = 3")
    with pytest.raises(TaskError, match=r"task.toml: not valid TOML .*line 1"):
        load_task(d)


@pytest.mark.parametrize("missing, expect", [
    ("instruction", "instruction.md: missing"), ("test", "test.sh: missing"), ("toml", "task.toml: missing")])
def test_missing_files(tmp_path, missing, expect):
    d = _task(tmp_path, instruction=None if missing == "instruction" else "x",
              test_sh=None if missing == "test" else "x")
    if missing == "toml":
        (d / "task.toml").unlink()
    with pytest.raises(TaskError, match=expect):
        load_task(d)


def test_empty_instruction(tmp_path):
    with pytest.raises(TaskError, match="instruction.md: empty"):
        load_task(_task(tmp_path, instruction="  \n"))


def test_task_set_rules(tmp_path):
    _task(tmp_path, "a", toml="[task]\nid = 'same'\n")
    _task(tmp_path, "b", toml="[task]\nid = 'same'\n")
    with pytest.raises(TaskError, match="task id 'same' is also used by"):
        load_tasks(tmp_path)
    with pytest.raises(TaskError, match="no task folders inside"):
        load_tasks(tmp_path / "a" / "tests")
    with pytest.raises(TaskError, match="no such folder"):
        load_tasks(tmp_path / "nope")


def test_more_rules(tmp_path):
    d = _task(tmp_path, "svc", toml="[[environment.services]]\nname='a'\ncommand=['x']\nport=1\n"
                                     "[[environment.services]]\nname='b'\ncommand=['y']\nport=1\n")
    with pytest.raises(TaskError, match="two services share the port 1"):
        load_task(d)
    d = _task(tmp_path, "thr", toml="[task]\npass_threshold = 1.5\n")
    with pytest.raises(TaskError, match="task.pass_threshold"):
        load_task(d)
    d = _task(tmp_path, "enc")
    (d / "instruction.md").write_bytes(b"caf\xe9")
    with pytest.raises(TaskError, match="not UTF-8"):
        load_task(d)


def test_a_task_folder_without_task_toml_is_not_skipped_silently(tmp_path):
    _task(tmp_path, "ok")
    typo = _task(tmp_path, "typo")
    (typo / "task.toml").rename(typo / "task.tml")
    with pytest.raises(TaskError, match="looks like a task .* has no task.toml"):
        load_tasks(tmp_path)


def test_solution_actions_load_in_order(tmp_path):
    d = _task(tmp_path)
    assert load_task(d).solution_actions is None
    (d / "solution").mkdir()
    actions = [{"tool": "bash", "arguments": {"command": "mv a.txt b.txt"}},
               {"tool": "write_file", "arguments": {"path": "c.txt", "content": "x\n"}}, {"answer": "Done."}]
    (d / "solution" / "actions.json").write_text(json.dumps(actions))
    assert list(load_task(d).solution_actions) == actions


@pytest.mark.parametrize("text, problem", [
    ("[{\"tool\": \"bash\"", "not valid UTF-8 JSON"),
    ("{\"tool\": \"bash\", \"arguments\": {}}", "must be a non-empty JSON list"),
    ("[]", "must be a non-empty JSON list"),
    ("[{\"tool\": \"bash\", \"arguments\": {\"command\": \"ls\"}}]", "item 0 .* must be the final answer"),
    ("[{\"answer\": \"a\"}, {\"answer\": \"b\"}]", "item 0 .* is an answer before the end"),
    ("[{\"tool\": \"bash\", \"args\": {}}, {\"answer\": \"ok\"}]", "item 0 .* exactly the keys tool and arguments"),
    ("[{\"tool\": \"\", \"arguments\": {}}, {\"answer\": \"ok\"}]", "item 0 .* not a non-empty name"),
    ("[{\"tool\": \"bash\", \"arguments\": \"ls\"}, {\"answer\": \"ok\"}]", "item 0 .* not a JSON object"),
    ("[\"ls\", {\"answer\": \"ok\"}]", "item 0 .* is not an object"),
    ("[{\"answer\": 3}]", "item 0 .* must be the final answer"),
])
def test_a_malformed_actions_file_names_the_file_and_the_problem(tmp_path, text, problem):
    d = _task(tmp_path)
    (d / "solution").mkdir()
    (d / "solution" / "actions.json").write_text(text)
    with pytest.raises(TaskError, match=problem) as e:
        load_task(d)
    assert str(d / "solution" / "actions.json") in str(e.value)
