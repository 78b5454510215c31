"""The main job end to end (`openforge demo`, starting its own vLLM on the CPU), and the closed loop: a shard with
real GRPO signal trains SmolLM2 one step (`openforge train`), and a second demo round serves the new checkpoint and
records its calls under the new policy version."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from forge_store import RolloutFilter, open_store
from learner._export import export
from learner._plan import ExportConfig
from proxy.engines.vllm_cpu import CACHE_ENV, ensure_model
from proxy.engines.scripted.script import Text, ToolCall, ToolCalls
from rollout._task import load_task
from tests.rollout_fixtures import EXAMPLES, make_forge

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
OPENFORGE = str(Path(sys.executable).parent / "openforge")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tasks(shared_tmp: Path, *names: str) -> Path:
    d = shared_tmp / "demo-tasks"
    for n in names:
        shutil.copytree(EXAMPLES / n, d / n)
    for p in [d, *d.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return d


def _openforge(shared_tmp: Path, *args: str, timeout: float = 1500) -> tuple[dict, str]:
    env = {**os.environ, "OPENFORGE_HOME": str(shared_tmp / "home"), "COLUMNS": "200"}
    p = subprocess.run([OPENFORGE, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_demo_main_job(shared_tmp):
    if os.environ.get("OPENFORGE_SKIP_SLOW") == "1":
        pytest.skip("OPENFORGE_SKIP_SLOW=1")
    store_url = f"sqlite:///{shared_tmp / 'demo.sqlite'}"
    tasks = _tasks(shared_tmp, "files-dedupe-mailing-list", "helpdesk-open-ticket-report")
    doc, err = _openforge(shared_tmp, "demo", "--tasks", str(tasks), "--group-size", "2", "--concurrency", "2",
                          "--max-turns", "2", "--max-tokens", "96", "--port", str(_free_port()), "--store", store_url)
    assert doc["rollouts"] == 4 and sum(doc["outcomes"].values()) == 4, doc
    assert doc["calls"] > 0 and doc["token_exact_calls"] == doc["calls"], doc
    assert doc["manifest_verified"] is True and Path(doc["shard"], "manifest.json").is_file(), doc
    assert "Outcomes by policy version" in err and "veRL shard" in err and "total time" in err, err[-3000:]
    store = open_store(store_url)
    try:
        ros = list(store.iter_rollouts(RolloutFilter(run_id=doc["run_id"])))
        graded = [r for r in ros if r.outcome not in ("infra_error", "cancelled")]
        assert graded and all(store.rewards(r.id) for r in graded), [(r.outcome, r.outcome_detail) for r in ros]
        assert {r.policy_version_id for r in ros} == {"smollm2-135m-instruct"}
        assert store.lineage("exports"), "the demo's export is recorded"
    finally:
        store.close()


def test_train_step_and_a_second_round_under_the_new_policy(up, shared_tmp):
    base = ensure_model(os.environ.get(CACHE_ENV), progress=False)
    forge = make_forge(up, shared_tmp, f"sqlite:///{shared_tmp / 'loop.sqlite'}")
    task = load_task(EXAMPLES / "files-config-to-json")
    solve = (task.path / "solution" / "solve.sh").read_text()
    try:
        forge.admin.register_policy_version("smollm2-base", "SmolLM2-135M-Instruct", checkpoint_id=str(base),
                                            engine="vllm", global_step=0)
        # One rollout solves the task, the other does not: the group's advantages are +-1/sqrt(2).
        up.double.script.extend([ToolCalls([ToolCall("bash", {"command": solve})]), Text("Done.")])
        summary = forge.run([task], "react", group_size=2, concurrency=1)
        assert sorted(r.outcome for r in summary.results) == ["failure", "success"]
        manifest = export(forge.store, shared_tmp / "shard", ExportConfig(format="verl",
                                                                          where=f"run_id = '{summary.run_id}'"))
        assert manifest["counts"]["rows"]["trajectories"] >= 2
    finally:
        forge.admin.close()
        forge.proxy.stop()
        forge.store.close()
    store_url = f"sqlite:///{shared_tmp / 'loop.sqlite'}"
    step, _ = _openforge(shared_tmp, "train", "--shard", str(shared_tmp / "shard"), "--store", store_url,
                         "--lr", "1e-4")
    assert step["nonzero_advantages"] >= 2 and step["weight_delta_l2"] > 0, step
    assert step["checkpoint_sha256"] != _sha_of(base)
    new = step["policy_version"]
    tasks = _tasks(shared_tmp, "finance-category-totals")
    doc, _ = _openforge(shared_tmp, "demo", "--policy", new, "--tasks", str(tasks), "--group-size", "1",
                        "--concurrency", "1", "--max-turns", "1", "--max-tokens", "32", "--port", str(_free_port()),
                        "--store", store_url)
    assert doc["policy_version"] == new and doc["calls"] >= 1, doc
    store = open_store(store_url)
    try:
        (pv,) = [r for r in store.lineage("policy_versions") if r["id"] == new]
        assert pv["global_step"] == 1 and pv["metadata"]["parent"] == "smollm2-base"
        for ro in store.iter_rollouts(RolloutFilter(run_id=doc["run_id"])):
            assert ro.policy_version_id == new
            assert {c.policy_version_id for c in store.calls(ro.id)} == {new}
    finally:
        store.close()


def _sha_of(model_dir: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()
