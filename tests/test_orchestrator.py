"""The orchestrator with real bubblewrap sandboxes, the embedded proxy and the scripted upstream: every outcome of
the taxonomy, groups sharing a policy version, retries, backpressure, and Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from forge_store import RolloutFilter
from proxy.engines.scripted.script import Delay, Text, ToolCall, ToolCalls
from rollout._task import load_task, load_tasks
from tests.rollout_fixtures import ANSWER_TEST as _ANSWER_TEST
from tests.rollout_fixtures import EXAMPLES, CommandHarness, write_task

ROOT = Path(__file__).resolve().parents[1]
# The verifier starts in a fresh HOME (docs/rollouts.md): it changes into the workspace itself.
ANSWER_TEST = _ANSWER_TEST.replace("#!/bin/bash\n", '#!/bin/bash\ncd "$OPENFORGE_WORKSPACE"\n', 1)


def _rollouts(store):
    return sorted(store.iter_rollouts(RolloutFilter()), key=lambda r: r.started_at)


def _answer_task(shared_tmp, name="answer", toml=""):
    return load_task(write_task(shared_tmp / "tasks", name, test_sh=ANSWER_TEST, toml=toml,
                                instruction="Write 42 into answer.txt.", solve_sh="echo 42 > answer.txt"))


def test_react_success_recorded_token_exact(forge):
    task = load_task(EXAMPLES / "files-config-to-json")
    solve = (task.path / "solution" / "solve.sh").read_text()
    forge.up.double.script.extend([ToolCalls([ToolCall("bash", {"command": solve})]), Text("Done: config.json written.")])
    summary = forge.run([task], "react")
    (res,) = summary.results
    assert res.outcome == "success" and res.reward == 1.0, res
    s = forge.store
    (ro,) = _rollouts(s)
    assert ro.outcome == "success" and ro.harness_id.startswith("react@") and ro.backend == "local"
    assert ro.image_ref == "python:3.11-slim" and ro.attempt == 1
    calls = s.calls(ro.id)
    assert len(calls) == 2 and all(c.token_exact and c.completion_token_ids for c in calls)
    tool_msgs = [m for m in calls[1].messages if m.get("role") == "tool"]
    assert tool_msgs and "exit code: 0" in tool_msgs[0]["content"]
    (reward,) = s.rewards(ro.id)
    assert reward.value == 1.0 and reward.source == "verifier" and reward.evidence_blob
    evidence = json.loads(s.get_blob(reward.evidence_blob))
    assert evidence["source"] == "reward.json" and evidence["exit_code"] == 0
    kinds = [e.kind for e in s.events(ro.id)]
    assert kinds[:1] == ["sandbox.created"] and {"harness.exited", "verifier.finished", "sandbox.destroyed"} <= set(kinds)
    assert forge.sandboxes() == []


def test_failure_is_graded_with_the_verifier_reward(forge, shared_tmp):
    task = _answer_task(shared_tmp)
    summary = forge.run([task], "react")   # the double's default answer echoes the instruction: no tool call
    (res,) = summary.results
    assert res.outcome == "failure" and res.reward == 0.0
    (ro,) = _rollouts(forge.store)
    assert [r.value for r in forge.store.rewards(ro.id)] == [0.0]


def test_harness_past_its_deadline_is_a_policy_timeout(forge, shared_tmp):
    task = _answer_task(shared_tmp)
    t0 = time.monotonic()
    summary = forge.run([task], CommandHarness("bash", "-c", "echo 42 > answer.txt; sleep 60"), agent_timeout_s=1.0)
    assert time.monotonic() - t0 < 20
    (res,) = summary.results
    assert res.outcome == "policy_timeout" and res.reward == 0.0
    (rw,) = forge.store.rewards(res.rollout_id)
    assert rw.value == 0.0 and rw.detail["forced_by"] == "policy_timeout" and rw.detail["verifier_reward"] == 1.0
    ev = next(e for e in forge.store.events(res.rollout_id) if e.kind == "harness.exited")
    assert ev.detail["timed_out"] is True


def test_harness_crash_is_a_harness_error(forge, shared_tmp):
    task = _answer_task(shared_tmp)
    summary = forge.run([task], CommandHarness("bash", "-c", "echo boom >&2; exit 3"))
    (res,) = summary.results
    assert res.outcome == "harness_error" and res.reward == 0.0 and "exit 3" in res.detail


def test_verifier_crash_is_an_infra_error_retried_and_never_a_reward(forge, shared_tmp):
    task = load_task(write_task(shared_tmp / "tasks", "broken-verifier", test_sh="echo oops >&2; exit 2"))
    summary = forge.run([task], CommandHarness("true"), max_infra_retries=1)
    assert [r.outcome for r in summary.results] == ["infra_error", "infra_error"]
    first, second = _rollouts(forge.store)
    assert second.retry_of == first.id and second.attempt == 2
    for ro in (first, second):
        assert ro.outcome == "infra_error" and forge.store.rewards(ro.id) == []
    excl = forge.store.lineage("exclusions")
    assert sorted(e["rollout_id"] for e in excl) == sorted([first.id, second.id])
    assert all(e["reason"] == "infra_error" and e["detail"]["kind"] == "verifier_crashed" for e in excl)


def test_unreachable_model_is_an_infra_error(forge, shared_tmp):
    forge.up.double.set_down(503)
    summary = forge.run([_answer_task(shared_tmp)], "react", max_infra_retries=0)
    (res,) = summary.results
    assert res.outcome == "infra_error" and res.infra_kind == "model_unreachable", res


def test_group_shares_one_policy_version(forge, shared_tmp):
    forge.admin.register_policy_version("v1", "mock-model", activate=True)
    summary = forge.run([_answer_task(shared_tmp)], "react", group_size=3, concurrency=3)
    assert summary.groups_complete == 1 and len(summary.results) == 3
    ros = _rollouts(forge.store)
    assert len({r.group_id for r in ros}) == 1 and {r.policy_version_id for r in ros} == {"v1"}
    for ro in ros:
        assert {c.policy_version_id for c in forge.store.calls(ro.id)} == {"v1"}


def test_policy_change_mid_group_supersedes_the_group(forge, shared_tmp):
    forge.admin.register_policy_version("v1", "mock-model", activate=True)
    task = _answer_task(shared_tmp)
    flip = threading.Timer(0.8, lambda: forge.admin.register_policy_version("v2", "mock-model", activate=True))
    flip.start()
    summary = forge.run([task], CommandHarness("bash", "-c", "sleep 1.5; echo 42 > answer.txt"), group_size=2,
                        concurrency=1)
    flip.join()
    assert summary.superseded_groups == 1
    ros = _rollouts(forge.store)
    assert [r.policy_version_id for r in ros] == ["v1", "v2", "v2"]
    assert len({r.group_id for r in ros[1:]}) == 1 and ros[0].group_id != ros[1].group_id
    with forge.store.engine.connect() as conn:
        kinds = [k for (k,) in conn.execute(sa.text("select kind from events where rollout_id is null"))]
    assert "group.superseded" in kinds


def test_backpressure_holds_new_rollouts_while_the_proxy_is_paused(forge, shared_tmp):
    task = _answer_task(shared_tmp)
    forge.admin._req("POST", "/admin/pause", json={"drain": False})
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("s", forge.run([task], CommandHarness("true"))))
    t.start()
    time.sleep(1.5)
    assert forge.store.flush(10) and _rollouts(forge.store) == []
    forge.admin._req("POST", "/admin/resume")
    t.join(60)
    assert out["s"].results[0].outcome == "failure"


def test_oracle_solves_every_example_task_in_the_sandbox(forge):
    tasks = load_tasks(EXAMPLES)
    summary = forge.run(tasks, "oracle", concurrency=2)
    bad = [(r.task_id, r.outcome, r.detail[-300:]) for r in summary.results if r.outcome != "success"]
    assert not bad and len(summary.results) == len(tasks) >= 12


def _cli(args, env, **kw):
    return subprocess.Popen([str(Path(sys.executable).parent / "openforge"), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _env(shared_tmp, **extra):
    return {**os.environ, "OPENFORGE_HOME": str(shared_tmp / "cli-home"),
            "OPENFORGE_SANDBOX_DIR": str(shared_tmp / "cli-sandboxes"), "COLUMNS": "200", **extra}


def test_ctrl_c_cancels_rollouts_and_leaves_nothing_behind(up, shared_tmp):
    task = write_task(shared_tmp / "tasks", "slow", test_sh=ANSWER_TEST)
    up.double.script.extend([Delay(60, then=Text("late"), times=None)])
    p = _cli(["run", str(task), "--harness", "react", "--group-size", "2", "--concurrency", "2",
              "--upstream", up.url], _env(shared_tmp))
    deadline = time.monotonic() + 60
    while len(up.double.requests) < 2:
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err.decode()[-2000:]
    sandboxes = shared_tmp / "cli-sandboxes"
    assert [d for d in sandboxes.iterdir() if d.is_dir() and not d.name.startswith(".")] == []   # .files: cache
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(sandboxes) not in ps
    from forge_store import open_store
    store = open_store(f"sqlite:///{shared_tmp / 'cli-home' / 'store.sqlite'}")
    try:
        assert [r.outcome for r in store.iter_rollouts(RolloutFilter())] == ["cancelled", "cancelled"]
    finally:
        store.close()


def test_cli_errors_say_what_to_do(up, shared_tmp):
    task = write_task(shared_tmp / "tasks", "t", test_sh=ANSWER_TEST)
    env = _env(shared_tmp, OPENFORGE_CACHE_DIR=str(shared_tmp / "empty-cache"))
    cases = [
        (["--harness", "codex"], "make harnesses"),
        (["--harness", "nope"], "known harnesses are react, oracle, mini-swe-agent, codex, claude-code"),
        (["--harness", "react", "--group-size", "0"], "--group-size 0"),
        (["--harness", "react", "--backend", "docker"], "known backends are local, kubernetes"),
    ]
    p = _cli(["run", str(task), "--upstream", up.url, "--model", "no-such-model", "--harness", "react"], env)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "--model 'no-such-model' is not served" in " ".join(err.decode().split()), err
    for extra, expect in cases:
        p = _cli(["run", str(task), "--upstream", up.url, *extra], env)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 2 and expect in " ".join(err.decode().split()), (extra, err.decode())
    bad = write_task(shared_tmp / "tasks", "bad", test_sh="x", toml="[agent]\ntimeout = 5\n")
    p = _cli(["run", str(bad), "--harness", "react", "--upstream", up.url], env)
    _, err = p.communicate(timeout=60)
    text = " ".join(err.decode().split())
    assert p.returncode == 2 and "task.toml" in text and "agent.timeout" in text, text


@pytest.mark.postgres
def test_run_on_postgresql_with_a_config_file(up, shared_tmp, pg_database):
    """The CLI's config-file form against the real PostgreSQL store: a group of the oracle on an example task."""
    cfg = shared_tmp / "run.toml"
    cfg.write_text(f'tasks = "{EXAMPLES / "finance-category-totals"}"\nharness = "oracle"\ngroup_size = 2\n'
                   f'concurrency = 2\nupstream = "{up.url}"\nstore = "{pg_database}"\n')
    p = _cli(["run", "--config", str(cfg), "--json"], _env(shared_tmp))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err.decode()[-3000:]
    doc = json.loads(out.decode().strip().splitlines()[-1])
    assert doc["outcomes"] == {"success": 2} and doc["groups_complete"] == 1
    from forge_store import open_store
    store = open_store(pg_database)
    try:
        ros = list(store.iter_rollouts(RolloutFilter(run_id=doc["run_id"])))
        assert len(ros) == 2 and all(r.outcome == "success" and store.rewards(r.id)[0].value == 1.0 for r in ros)
        (task,) = [t for t in store.lineage("tasks") if t["id"] == "finance-category-totals"]
        assert task["metadata"]["reference_steps"] and task["domain"] == "csv-finance"
    finally:
        store.close()
    bad = shared_tmp / "bad.toml"
    bad.write_text('harness = "oracle"\ngroup_sise = 2\n')
    p = _cli(["run", "--config", str(bad)], _env(shared_tmp))
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "group_sise" in err.decode()


def test_a_harness_that_kills_a_task_service_fails_instead_of_getting_a_retry(forge, shared_tmp):
    d = write_task(shared_tmp / "tasks", "svc", test_sh=ANSWER_TEST, toml=(
        "[[environment.services]]\nname = 'api'\nport = 8931\n"
        "command = ['python3', '-m', 'http.server', '8931', '--bind', '127.0.0.1']\n"))
    summary = forge.run([load_task(d)], CommandHarness("bash", "-c", "pkill -f 'http[.]server'; echo 42 > answer.txt"),
                        max_infra_retries=2)
    (res,) = summary.results
    assert res.outcome == "harness_error" and res.reward == 0.0 and "api" in res.detail, res


def test_backpressure_reads_proxy_in_flight_and_the_upstream_queue(forge):
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from rollout._backpressure import Backpressure

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):
            body = (b'# HELP vllm:num_requests_waiting waiting\nvllm:num_requests_waiting{model_name="m"} 3.0\n'
                    b'vllm:num_requests_waiting{model_name="n"} 2.0\n')
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_port}/metrics"
        assert Backpressure(forge.admin, max_in_flight=None, metrics_url=url, max_waiting=5).blocked() == \
            "upstream queue 5 >= 5"
        assert Backpressure(forge.admin, max_in_flight=None, metrics_url=url, max_waiting=6).blocked() is None
    finally:
        srv.shutdown()
    forge.up.double.script.extend([Delay(2.0, then=Text("slow"))])
    token = forge.admin.register_rollout(rollout_id="bp")["token"]
    import openai
    client = openai.OpenAI(base_url=forge.proxy.url + "/v1", api_key=token, max_retries=0)
    t = threading.Thread(target=lambda: client.chat.completions.create(
        model="mock-model", messages=[{"role": "user", "content": "hi"}]))
    t.start()
    bp = Backpressure(forge.admin, max_in_flight=1, metrics_url=None, max_waiting=None, interval_s=0)
    deadline = time.monotonic() + 5
    while bp.blocked() is None:
        assert time.monotonic() < deadline, "the in-flight call never showed"
        time.sleep(0.05)
    assert bp.blocked() == "proxy in-flight calls 1 >= 1"
    t.join(10)
    assert bp.blocked() is None


@pytest.mark.skipif(os.geteuid() != 0, reason="privileges are dropped only when the orchestrator runs as root")
def test_a_task_in_a_private_folder_runs_and_private_files_stay_private(forge, shared_tmp):
    """A checkout under /root or mktemp -d is not searchable by the sandbox user: its task folders and the package's
    own in-sandbox scripts are copied where that user can bind them, without widening any file's permissions."""
    private = shared_tmp / "private"
    d = write_task(private, "priv", test_sh=ANSWER_TEST, solve_sh="cat /environment/data.txt > answer.txt; "
                   "cat /environment/secret.txt >> answer.txt 2>/dev/null; true")
    (d / "environment").mkdir()
    (d / "environment" / "data.txt").write_text("42")
    (d / "environment" / "secret.txt").write_text("not for the sandbox")
    os.chmod(d / "environment", 0o755)
    os.chmod(d / "environment" / "data.txt", 0o644)
    os.chmod(d / "environment" / "secret.txt", 0o600)
    os.chmod(private, 0o700)
    summary = forge.run([load_task(d)], "oracle")
    (res,) = summary.results
    assert res.outcome == "success", (res.outcome, res.detail)      # data.txt read; secret.txt refused


def test_the_verifier_runs_with_exactly_the_documented_environment(forge, shared_tmp):
    from rollout._backends.base import verifier_env
    test_sh = ('python3 -c "import json, os; json.dump({\'reward\': 1, \'env\': dict(os.environ), '
               '\'cwd\': os.getcwd(), \'home\': os.listdir(os.environ[\'HOME\'])}, '
               'open(os.environ[\'OPENFORGE_REWARD_DIR\'] + \'/reward.json\', \'w\'))"\n')
    task = load_task(write_task(shared_tmp / "tasks", "env", test_sh=test_sh, toml="[verifier.env]\nMY_KEY = 'x'\n"))
    harness = CommandHarness("bash", "-c", "echo 'export LD_PRELOAD=x' >> ~/.bashrc; mkdir -p /tmp/openforge-verifier/"
                             "home; touch /tmp/openforge-verifier/home/planted", env={"LD_PRELOAD": "", "EVIL": "1"})
    (res,) = forge.run([task], harness).results
    doc = res.extra["evidence"]["verifier"]
    env = {k: v for k, v in doc["env"].items() if k not in ("PWD", "SHLVL", "_")}   # bash's own
    assert env == verifier_env(workdir="/workspace", home=env["HOME"], tmpdir=env["TMPDIR"], task_env={"MY_KEY": "x"})
    assert doc["cwd"] == env["HOME"] and doc["home"] == [], doc


@pytest.mark.parametrize("make", ["ln -s /tests/test.sh reward.json", "mkfifo reward.json", "mkdir reward.json"])
def test_a_reward_file_that_is_not_a_regular_file_is_refused_and_graded_0(forge, shared_tmp, make):
    test_sh = f'cd "$OPENFORGE_REWARD_DIR"; echo \'{{"reward": 1}}\' > real.json; {make}\n'
    task = load_task(write_task(shared_tmp / "tasks", "linked-reward", test_sh=test_sh))
    (res,) = forge.run([task], CommandHarness("true"), max_infra_retries=0).results
    assert (res.outcome, res.reward) == ("failure", 0.0), res.detail
    assert "/logs/verifier/reward.json" in res.extra["evidence"]["refused"]
    assert forge.store.lineage("exclusions") == []
