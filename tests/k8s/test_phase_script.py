"""The in-pod phase wrapper, run for real with /bin/sh: files in, exit code and outputs out via the message."""

from __future__ import annotations

import base64
import os
import subprocess

from rollout._backends.kubernetes.results import PHASE_SCRIPT, message, message_limit, parse_message, split_log


def run(tmp_path, argv, *, outputs=(), files=(), timeout_s=0, max_bytes=4096, mode="phase"):
    fdir = tmp_path / "files"
    fdir.mkdir(exist_ok=True)
    lines = []
    for i, (path, data, perm) in enumerate(files):
        (fdir / f"file-{i}").write_bytes(data)
        lines.append(f"file-{i}\t{perm:o}\t{path}")
    log = tmp_path / "termination-log"
    log.write_text("")
    env = {"PATH": os.environ["PATH"], "OPENFORGE_FILES_DIR": str(fdir), "OPENFORGE_FILES": "\n".join(lines),
           "OPENFORGE_OUTPUTS": "\n".join(outputs), "OPENFORGE_TIMEOUT_S": str(timeout_s),
           "OPENFORGE_MESSAGE_MAX": str(max_bytes), "OPENFORGE_TERMINATION_LOG": str(log),
           "OPENFORGE_SCRATCH": str(tmp_path), "OPENFORGE_MODE": mode}
    proc = subprocess.run(["/bin/sh", "-c", PHASE_SCRIPT, "openforge-phase", *argv], env=env, capture_output=True,
                          timeout=60, check=False)
    return proc, log.read_text()


def test_exit_code_outputs_and_files(tmp_path):
    out = tmp_path / "logs" / "reward.json"
    cfg = tmp_path / "home" / ".config" / "agent.toml"
    script = f'cat "{cfg}" > "{out}.cfg"; echo \'{{"reward": 0.5}}\' > "{out}"; echo working; exit 3'
    proc, msg = run(tmp_path, ["/bin/sh", "-c", f'mkdir -p "{out.parent}"; {script}'],
                    outputs=(str(out), str(tmp_path / "missing.json")), files=((str(cfg), b"key = 1\n", 0o600),))
    assert proc.returncode == 0                      # the wrapper always succeeds: the init sequence continues
    assert b"working" in proc.stdout
    result = parse_message(msg)
    assert result.exit_code == 3 and not result.timed_out and not result.overflow
    assert result.outputs == {str(out): b'{"reward": 0.5}\n'}
    assert (cfg.stat().st_mode & 0o777) == 0o600 and (tmp_path / "logs" / "reward.json.cfg").read_bytes() == \
        b"key = 1\n"


def test_binary_output_round_trips(tmp_path):
    blob = bytes(range(256)) * 3
    path = tmp_path / "out.bin"
    path.write_bytes(blob)
    _, msg = run(tmp_path, ["true"], outputs=(str(path),))
    assert parse_message(msg).outputs[str(path)] == blob


def test_overflow_goes_to_the_log(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b"y" * 5000)
    proc, msg = run(tmp_path, ["/bin/sh", "-c", "echo before"], outputs=(str(big),))
    result = parse_message(msg)
    assert result.overflow and result.exit_code == 0 and not result.outputs
    own, full = split_log(proc.stdout.decode())
    assert own.strip() == "before" and full.outputs[str(big)] == b"y" * 5000


def test_timeout_is_reported(tmp_path):
    _, msg = run(tmp_path, ["sleep", "5"], timeout_s=1)
    result = parse_message(msg)
    assert result.timed_out and result.exit_code != 0


def test_service_mode_execs(tmp_path):
    proc, msg = run(tmp_path, ["/bin/sh", "-c", "echo service; exit 7"], mode="service")
    assert proc.returncode == 7 and msg == "" and proc.stdout == b"service\n"


def test_message_helpers():
    m = message(0, {"/a": b"\x00\x01"})
    assert parse_message(m).outputs == {"/a": b"\x00\x01"}
    assert base64.b64decode(__import__("json").loads(m)["outputs"]["/a"]) == b"\x00\x01"
    assert message_limit(2) == 4096 and message_limit(6) == 2048
