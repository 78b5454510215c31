"""The local sandbox backend, on bubblewrap: one set of namespaces per rollout, no cluster, no container engine.

Each sandbox gets a private workspace and HOME (host folders under ``root/<rollout id>/``), a read-only view of
``/usr`` and a short list of ``/etc`` files, private ``/tmp``, ``/proc`` and ``/dev``, its own pid, ipc, uts and
network namespaces (only loopback), and the proxy through one bind-mounted Unix socket that ``sandbox_init`` relays
to ``127.0.0.1:8000`` inside. When the orchestrator runs as root, bubblewrap is started as an unprivileged user
(``nobody``) so nothing root-owned on the host is readable even if a path were mounted by mistake; inside, the
harness is uid 1000 with no capabilities.

Phases run inside the same namespaces through ``sandbox_init`` (an inherited socket, not a path). Per-phase mounts
(``/tests`` for the verifier, ``/solution`` for the oracle, ``/logs/verifier``) are bind-mounted from empty,
root-owned staging folders at creation and filled only while their phase runs, so the harness never sees them.

Not enforced here (say so rather than pretend): CPU and memory limits (no cgroup delegation without systemd); the
file-size limit applies per process (RLIMIT_FSIZE).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from .base import PROXY_PORT, Phase, PhaseResult, Sandbox, SandboxError, SandboxSpec

INIT_PATH = "/opt/openforge/init.py"
PROXY_SOCKET = "/run/openforge/proxy.sock"
SANDBOX_HOME = "/home/agent"
SANDBOX_UID = 1000
ETC_FILES = ("alternatives", "ssl", "ca-certificates", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime",
             "mime.types", "os-release", "debian_version", "bash.bashrc", "profile", "inputrc", "protocols", "services",
             "magic", "magic.mime", "gai.conf", "host.conf")
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"
INIT_GRACE_S = 15.0


def bwrap_install_hint() -> str:
    return "install bubblewrap: `apt-get install -y bubblewrap` (Debian/Ubuntu) or `make sandbox`"


class LocalBackend:
    """Sandboxes under ``root``; ``python`` is the interpreter ``sandbox_init`` runs under inside the sandbox."""

    name = "local"

    def __init__(self, root: str | Path, *, proxy_socket: str | Path | None = None, bwrap: str = "bwrap",
                 python: str = "/usr/bin/python3", run_as: int | None = None, proxy_port: int = PROXY_PORT):
        self.root = Path(root)
        self.proxy_socket = Path(proxy_socket) if proxy_socket else None
        self.bwrap = shutil.which(bwrap)
        if self.bwrap is None:
            raise SandboxError(f"bubblewrap ({bwrap!r}) is not on PATH: {bwrap_install_hint()}", kind="sandbox_missing")
        self.python = python
        if not Path(python).exists():
            raise SandboxError(f"{python} is missing: sandbox_init needs a python3 under /usr; install python3",
                               kind="sandbox_missing")
        self.run_as = (65534 if os.geteuid() == 0 else None) if run_as is None else run_as
        self.proxy_port = proxy_port
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)
        if self.run_as is not None and not _reachable(self.root, read=False):
            raise SandboxError(f"sandbox folder {self.root}: the unprivileged sandbox user cannot reach it (a folder "
                               f"above it is not searchable by others, e.g. a private /root or mktemp checkout); set "
                               f"OPENFORGE_SANDBOX_DIR to a folder such as /var/tmp/openforge/sandboxes",
                               kind="sandbox_setup")
        self._files = self.root / ".files"       # copies of single files the sandbox user could not reach
        self._ids = itertools.count(1)

    # --- interface -----------------------------------------------------------------------------------------
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    def create(self, spec: SandboxSpec) -> Sandbox:
        t0 = time.monotonic()
        d = self.root / spec.rollout_id
        if d.exists():
            raise SandboxError(f"sandbox folder {d} already exists: rollout ids must be unique", kind="sandbox_conflict")
        sb = Sandbox(id=spec.rollout_id, spec=spec, backend=self.name, created_at=time.time(),
                     backend_state={"dir": d, "lock": threading.Lock(), "buf": b""})
        try:
            argv, keep_fd, sb.backend_state["ctl"] = self._prepare(d, spec)
            try:
                with open(d / "backend.log", "wb") as log:
                    proc = subprocess.Popen(argv, pass_fds=(keep_fd,), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=log, start_new_session=True,
                                            env={"PATH": BASE_PATH, "LANG": "C.UTF-8"}, **self._creds())
            finally:
                os.close(keep_fd)
            sb.backend_state["proc"] = proc
            (d / "meta.json").write_text(json.dumps({"rollout_id": spec.rollout_id, "run_id": spec.run_id,
                                                     "pid": proc.pid, "owner_pid": os.getpid(),
                                                     "created_at": sb.created_at}))
            hello = self._recv(sb, deadline=time.monotonic() + INIT_GRACE_S, cancel=None)
            if not hello.get("ready"):
                raise SandboxError(f"sandbox {spec.rollout_id}: init did not start: {hello}", kind="sandbox_start")
        except SandboxError:
            self.destroy(sb)
            raise
        except OSError as exc:
            self.destroy(sb)
            raise SandboxError(f"sandbox {spec.rollout_id} could not be created: {exc}", kind="sandbox_start") from exc
        sb.started_ms = (time.monotonic() - t0) * 1000
        return sb

    def run_phase(self, sandbox: Sandbox, phase: Phase, *, cancel: threading.Event | None = None) -> PhaseResult:
        st = sandbox.backend_state
        staged = self._stage(sandbox, phase)
        try:
            for path, data, mode in phase.files:
                self._call(sandbox, {"op": "write", "path": path, "data": _b64(data), "mode": mode}, 30, cancel)
            req = {"argv": list(phase.argv), "env": self._env(sandbox, phase), "cwd": phase.cwd or sandbox.spec.workdir,
                   "timeout_s": phase.timeout_s}
            if phase.background:
                req |= {"op": "start", "name": phase.name, "ready_port": phase.ready_port}
            else:
                req |= {"op": "run"}
            t0 = time.monotonic()
            resp = self._call(sandbox, req, phase.timeout_s + INIT_GRACE_S, cancel)
            if resp.get("cancelled"):
                return PhaseResult(phase.name, None, cancelled=True, duration_s=time.monotonic() - t0)
            result = PhaseResult(phase.name, resp.get("exit_code"), timed_out=bool(resp.get("timed_out")),
                                 duration_s=resp.get("duration_s", time.monotonic() - t0),
                                 stdout=_unb64(resp.get("stdout")), stderr=_unb64(resp.get("stderr")),
                                 services={k.removeprefix("service:"): v for k, v in
                                           (resp.get("services") or {}).items()})
            for out in phase.outputs:
                data = self._read(sandbox, out, cancel)
                if data is not None:
                    result.outputs[out] = data
            return result
        finally:
            self._unstage(st, staged)

    def exec(self, sandbox: Sandbox, argv: list[str], *, timeout_s: float = 60.0,
             env: dict[str, str] | None = None) -> PhaseResult:
        return self.run_phase(sandbox, Phase("exec", tuple(argv), env=env or {}, timeout_s=timeout_s))

    def put_file(self, sandbox: Sandbox, path: str, data: bytes, mode: int = 0o644) -> None:
        resp = self._call(sandbox, {"op": "write", "path": path, "data": _b64(data), "mode": mode}, 30, None)
        if "error" in resp:
            raise SandboxError(f"put_file {path}: {resp['error']}", kind="sandbox_io")

    def get_file(self, sandbox: Sandbox, path: str) -> bytes:
        data = self._read(sandbox, path, None)
        if data is None:
            raise FileNotFoundError(f"{path} does not exist in sandbox {sandbox.id}")
        return data

    def logs(self, sandbox: Sandbox) -> str:
        st = sandbox.backend_state
        parts = []
        if st.get("proc") and st["proc"].poll() is None:
            try:
                parts.append(_unb64(self._call(sandbox, {"op": "logs"}, 10, None).get("data")).decode(errors="replace"))
            except SandboxError:
                pass
        log = Path(st["dir"]) / "backend.log"
        if log.exists():
            parts.append(log.read_text(errors="replace"))
        return "".join(parts)

    def events(self, sandbox: Sandbox) -> list[dict]:
        return []   # no platform between us and the sandbox: what happens is recorded by the orchestrator itself

    def describe(self, sandbox: Sandbox) -> dict:
        proc = sandbox.backend_state.get("proc")
        return {"backend": self.name, "sandbox_id": sandbox.id, "pid": proc.pid if proc else None,
                "bwrap": self.bwrap, "bwrap_version": _bwrap_version(self.bwrap), "node_name": socket.gethostname(),
                "image_ref": sandbox.spec.image, "image_digest": None, "started_ms": round(sandbox.started_ms, 2),
                "run_as_uid": self.run_as}

    def destroy(self, sandbox: Sandbox) -> None:
        st = sandbox.backend_state
        proc = st.get("proc")
        if proc is not None:
            _kill_group(proc)
        ctl = st.get("ctl")
        if ctl is not None:
            ctl.close()
            st["ctl"] = None
        shutil.rmtree(st["dir"], ignore_errors=True)

    def reap(self, *, run_id: str | None = None) -> list[str]:
        """Remove sandboxes whose orchestrator is gone (or all of ``run_id``'s), killing what still runs."""
        removed = []
        for d in sorted(self.root.iterdir()) if self.root.exists() else []:
            meta = _read_meta(d)
            if meta is None:
                continue
            mine = run_id is not None and meta.get("run_id") == run_id
            orphan = not _alive(meta.get("owner_pid"))
            if not (mine or orphan):
                continue
            pid = meta.get("pid")
            if pid and _is_bwrap(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d.name)
        return removed

    # --- internals -----------------------------------------------------------------------------------------
    def _creds(self) -> dict:
        if self.run_as is None:
            return {}
        return {"user": self.run_as, "group": self.run_as, "extra_groups": []}

    def _own(self, path: Path) -> None:
        if self.run_as is None:
            return
        os.chown(path, self.run_as, self.run_as)
        for p in path.rglob("*"):
            os.lchown(p, self.run_as, self.run_as)

    def _prepare(self, d: Path, spec: SandboxSpec) -> tuple[list[str], int, socket.socket]:
        d.mkdir(mode=0o711)
        ws, home, etc = d / "workspace", d / "home", d / "etc"
        if spec.workspace_seed is not None:
            shutil.copytree(spec.workspace_seed, ws, symlinks=True)
        else:
            ws.mkdir()
        home.mkdir()
        etc.mkdir()
        self._own(ws)
        self._own(home)
        (etc / "passwd").write_text(f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                                    f"agent:x:{SANDBOX_UID}:{SANDBOX_UID}:agent:{SANDBOX_HOME}:/bin/bash\n"
                                    f"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
        (etc / "group").write_text(f"root:x:0:\nagent:x:{SANDBOX_UID}:\nnogroup:x:65534:\n")
        (etc / "hosts").write_text("127.0.0.1 localhost sandbox\n::1 localhost\n")
        init_src = self._visible_file(Path(__file__).with_name("sandbox_init.py"))
        a = [self.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--hostname", "sandbox",
             "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL", "--clearenv",
             "--ro-bind", "/usr", "/usr"]
        for link in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
            if Path(f"/{link}").is_symlink():
                a += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
        for name in ETC_FILES:
            a += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        for name in ("passwd", "group", "hosts"):
            a += ["--ro-bind", str(etc / name), f"/etc/{name}"]
        a += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run", "--tmpfs", "/var",
              "--dir", "/var/tmp", "--bind", str(ws), spec.workdir, "--bind", str(home), SANDBOX_HOME,
              "--ro-bind", str(init_src), INIT_PATH]
        if spec.environment_dir is not None:
            env_dir = spec.environment_dir
            if self.run_as is not None and not _reachable(env_dir):
                env_dir = d / "environment"          # a task in a private folder: this rollout gets a copy
                shutil.copytree(spec.environment_dir, env_dir, symlinks=True)
                _searchable_dirs(env_dir)
            a += ["--ro-bind", str(env_dir), "/environment"]
        for m in spec.mounts:
            a += ["--bind" if m.writable else "--ro-bind", str(self._visible(m.source)), m.target]
        for i, m in enumerate(_phase_mounts(spec)):
            stage = d / "stage" / str(i)
            stage.mkdir(parents=True)
            a += ["--bind" if m.writable else "--ro-bind", str(stage), m.target]
        if self.proxy_socket is not None:
            a += ["--ro-bind", str(self.proxy_socket), PROXY_SOCKET]
        a += ["--chdir", spec.workdir, "--setenv", "PATH", BASE_PATH, "--setenv", "HOME", SANDBOX_HOME]
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fd = os.dup(child.fileno())
        child.close()
        os.set_inheritable(fd, True)
        a += ["--", self.python, "-I", "-S", INIT_PATH, "--ctl-fd", str(fd),
              "--fsize-mb", str(spec.resources.storage_mb)]
        if self.proxy_socket is not None:
            a += ["--bridge-port", str(self.proxy_port), "--bridge-socket", PROXY_SOCKET]
        return a, fd, parent

    def _visible(self, source: Path) -> Path:
        """``source`` as the sandbox user can bind it: as is when reachable, a copy for a file, else an error."""
        if self.run_as is None or _reachable(source):
            return source
        if Path(source).is_file():
            return self._visible_file(source)
        raise SandboxError(f"mount source {source}: the unprivileged sandbox user cannot reach it (a folder above it is "
                           f"private); install it under a world-readable folder (as root the harness installs go to "
                           f"/var/cache/openforge, OPENFORGE_CACHE_DIR)", kind="sandbox_setup")

    def _visible_file(self, source: Path) -> Path:
        """A file others may read whose folder is private gets a copy under the sandbox root; any other file is
        bound as it is (a private file stays private: copying must never widen who can read it)."""
        if self.run_as is None or _reachable(source) or not source.stat().st_mode & 0o004:
            return source
        st = source.stat()
        key = hashlib.sha256(f"{source.resolve()}|{st.st_mtime_ns}|{st.st_size}".encode()).hexdigest()[:16]
        copy = self._files / key / source.name
        if not copy.exists():
            copy.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(self._files, 0o755)
            os.chmod(copy.parent, 0o755)
            tmp = copy.with_name(copy.name + f".{os.getpid()}.{threading.get_ident()}")
            shutil.copyfile(source, tmp)
            os.chmod(tmp, 0o644)
            os.replace(tmp, copy)
        return copy

    def _stage(self, sandbox: Sandbox, phase: Phase) -> list[Path]:
        """Fill this phase's staging folders; they were bind-mounted (empty) when the sandbox was created."""
        st, staged = sandbox.backend_state, []
        targets = {m.target: i for i, m in enumerate(_phase_mounts(sandbox.spec))}
        for m in phase.mounts:
            stage = Path(st["dir"]) / "stage" / str(targets[m.target])
            if m.source is not None and Path(m.source).is_dir():
                shutil.copytree(m.source, stage, symlinks=True, dirs_exist_ok=True)
                if self.run_as is not None and not m.writable:
                    _searchable_dirs(stage)
            if m.writable:
                self._own(stage)
            staged.append(stage)
        return staged

    def _unstage(self, st: dict, staged: list[Path]) -> None:
        for stage in staged:
            if not stage.exists():
                continue
            for p in stage.iterdir():
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            if self.run_as is not None:
                os.chown(stage, 0, 0)

    def _env(self, sandbox: Sandbox, phase: Phase) -> dict[str, str]:
        spec = sandbox.spec
        env = {"PATH": BASE_PATH, "HOME": SANDBOX_HOME, "USER": "agent", "LOGNAME": "agent", "LANG": "C.UTF-8",
               "TMPDIR": "/tmp", "OPENFORGE_WORKSPACE": spec.workdir, "OPENFORGE_TESTS": "/tests",
               "OPENFORGE_SOLUTION": "/solution", "OPENFORGE_ENVIRONMENT": "/environment",
               "OPENFORGE_REWARD_DIR": "/logs/verifier"}
        return env | dict(phase.env)

    def _read(self, sandbox: Sandbox, path: str, cancel) -> bytes | None:
        resp = self._call(sandbox, {"op": "read", "path": path}, 30, cancel)
        return None if "error" in resp else _unb64(resp.get("data"))

    def _call(self, sandbox: Sandbox, req: dict, timeout_s: float, cancel: threading.Event | None) -> dict:
        st = sandbox.backend_state
        if st.get("ctl") is None:
            raise SandboxError(f"sandbox {sandbox.id} is gone", kind="sandbox_lost")
        with st["lock"]:
            req = dict(req, id=next(self._ids))
            try:
                st["ctl"].sendall((json.dumps(req) + "\n").encode())
            except OSError as exc:
                raise SandboxError(f"sandbox {sandbox.id} stopped answering ({exc})", kind="sandbox_lost") from None
            resp = self._recv(sandbox, deadline=time.monotonic() + timeout_s, cancel=cancel)
        return resp

    def _recv(self, sandbox: Sandbox, *, deadline: float, cancel: threading.Event | None) -> dict:
        st = sandbox.backend_state
        ctl = st["ctl"]
        while b"\n" not in st["buf"]:
            if cancel is not None and cancel.is_set():
                self.destroy(sandbox)
                return {"cancelled": True}
            left = deadline - time.monotonic()
            if left <= 0:
                self.destroy(sandbox)
                raise SandboxError(f"sandbox {sandbox.id} did not answer in time; destroyed", kind="sandbox_lost")
            ready, _, _ = select.select([ctl], [], [], min(left, 0.1))
            if ready:
                chunk = ctl.recv(1 << 20)
                if not chunk:
                    proc = st.get("proc")
                    code = proc.poll() if proc else None
                    raise SandboxError(f"sandbox {sandbox.id} exited (bwrap status {code}): "
                                       f"{self._backend_log(sandbox)[-2000:]}", kind="sandbox_lost")
                st["buf"] += chunk
        line, st["buf"] = st["buf"].split(b"\n", 1)
        return json.loads(line)

    def _backend_log(self, sandbox: Sandbox) -> str:
        log = Path(sandbox.backend_state["dir"]) / "backend.log"
        return log.read_text(errors="replace") if log.exists() else ""


def _searchable_dirs(root: Path) -> None:
    """Let others search the folders of a root-made copy. File modes are kept: a file the task made private stays
    unreadable to the sandbox user, as it would be in place."""
    for p in [root, *root.rglob("*")]:
        if p.is_dir() and not p.is_symlink():
            os.chmod(p, p.stat().st_mode | 0o055)


def _reachable(path: Path, *, read: bool = True) -> bool:
    """Can a user who is neither owner nor group (``nobody``) reach ``path``: every folder above it searchable by
    others, and (``read``) the path itself readable, and for a folder searchable, by others."""
    p = Path(path).resolve()
    try:
        for parent in reversed(p.parents):
            if not parent.stat().st_mode & 0o001:
                return False
        mode = p.stat().st_mode
    except OSError:
        return False
    if not read:
        return True
    return bool(mode & 0o004) and (not p.is_dir() or bool(mode & 0o001))


def _phase_mounts(spec: SandboxSpec) -> list:
    seen, out = set(), []
    for ph in spec.phases:
        for m in ph.mounts:
            if m.target not in seen:
                seen.add(m.target)
                out.append(m)
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _read_meta(d: Path) -> dict | None:
    try:
        return json.loads((d / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def _alive(pid) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _is_bwrap(pid: int) -> bool:
    try:
        return b"bwrap" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


_VERSION: dict[str, str] = {}


def _bwrap_version(path: str) -> str:
    if path not in _VERSION:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
        _VERSION[path] = out.stdout.strip() or out.stderr.strip()
    return _VERSION[path]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(s: str | None) -> bytes:
    return base64.b64decode(s) if s else b""
