"""`openforge demo` failure paths: each a clear message and a non-zero exit, before anything heavy starts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.engines.vllm_cpu import ENV_SPEC, MODEL_SPEC, READY

ROOT = Path(__file__).resolve().parents[1]
OPENFORGE = str(Path(sys.executable).parent / "openforge")


def _demo(tmp_path, *args, **env):
    e = {**os.environ, "OPENFORGE_HOME": str(tmp_path / "home"), "COLUMNS": "250", **env}
    p = subprocess.run([OPENFORGE, "demo", *args], cwd=ROOT, env=e, capture_output=True, text=True, timeout=120)
    return p.returncode, " ".join(p.stderr.split())


def test_bubblewrap_missing(tmp_path):
    code, err = _demo(tmp_path, PATH=str(tmp_path / "empty-path"))
    assert code == 2 and "bubblewrap" in err and "apt-get install -y bubblewrap" in err, err


def test_unreachable_upstream(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]        # bound, never listening: connections are refused
        code, err = _demo(tmp_path, "--upstream", f"http://127.0.0.1:{port}")
    assert code == 2 and f"--upstream http://127.0.0.1:{port} is unreachable" in err, err


def test_port_in_use(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, err = _demo(tmp_path, "--port", str(port))
    assert code == 2 and f"port {port} is in use" in err and "--port" in err, err


def _fake_cache(tmp_path):
    """A cache whose environment and model say they are complete (nothing in it runs before the checks)."""
    cache = tmp_path / "vllm-cpu"
    (cache / "venv" / "bin").mkdir(parents=True)
    (cache / "venv" / READY).write_text(json.dumps(ENV_SPEC))
    model = cache / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    (model / READY).write_text(json.dumps(MODEL_SPEC))
    return cache, model


def test_corrupt_model_cache(tmp_path):
    cache, model = _fake_cache(tmp_path)
    code, err = _demo(tmp_path, "--port", "0", OPENFORGE_VLLM_CPU_CACHE=str(cache))
    assert code == 2 and "is corrupt" in err and f"rm -rf {model}" in err, err


def test_unknown_policy_version(tmp_path):
    cache, _ = _fake_cache(tmp_path)
    code, err = _demo(tmp_path, "--policy", "nope", "--port", "0", OPENFORGE_VLLM_CPU_CACHE=str(cache))
    assert code == 2 and "--policy 'nope' is not in the store" in err and "openforge train" in err, err


@pytest.mark.parametrize("args, says", [
    (["--group-size", "1"], "--group-size 1: a GRPO group needs at least 2 rollouts"),
    (["--families", "files,nope"], "--families files,nope: unknown nope; the families are check, files, plan, recover"),
    (["--demo-tasks", "20", "--train-tasks", "10"], "--demo-tasks 20 is more than --train-tasks 10"),
    (["--heldout-tasks", "3"], "--heldout-tasks 3: fewer than the 4 families"),
    (["--loss-agg", "mean"], "--loss-agg 'mean': one of token-mean"),
    (["--grpo-lr", "0"], "--grpo-lr 0.0: a learning rate is a positive number"),
])
def test_a_bad_loop_setting_is_refused_before_anything_starts(tmp_path, args, says):
    code, err = _demo(tmp_path, "--port", "0", *args)
    assert code == 2 and says in err, err
    assert not (tmp_path / "home" / "store.sqlite").exists()
