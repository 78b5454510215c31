"""The process that lives inside each local sandbox (stdlib only: it runs under the sandbox's own python3).

It is the sandbox's pid 1 (``bwrap --as-pid-1``) and not dumpable, so nothing the harness runs (same uid) can kill,
stop or ptrace it, nor read its ``/proc/1`` files: a signal from inside the namespace reaches pid 1 only through a
handler, and it installs none (``kill -9 -1`` skips it). As pid 1 it reaps every orphan of the namespace.

It does two jobs:

- **control**: it reads newline-delimited JSON requests from an inherited socket (fd ``--ctl-fd``; no path exists
  inside the sandbox, so nothing the harness runs can reach it) and runs phases: foreground commands with a deadline,
  background services with a readiness port, file reads and writes. After every foreground phase it stops and kills
  every process in the sandbox except itself and the services until none is left (``kill_strays``), so nothing a
  harness leaves running can touch the verifier's work. A ``clean`` phase (the verifier) starts only when that
  holds, in a HOME and TMPDIR made fresh for it.
- **bridge**: it listens on ``127.0.0.1:--bridge-port`` inside the sandbox's private network namespace and relays
  each connection to the proxy's Unix socket (``--bridge-socket``), the sandbox's only way out.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types

TAIL_BYTES = 256 * 1024
KILL_CAP_S = 10.0            # how long kill_strays keeps at it before it reports survivors
PR_SET_DUMPABLE = 4


def _relay_thread(port: int, socket_path: str) -> threading.Thread:
    """Accept on 127.0.0.1:port, relay each connection to the Unix socket (threads: asyncio costs ~70 ms to import)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
                try:
                    s.shutdown(how)
                except OSError:
                    pass

    def serve(conn: socket.socket) -> None:
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            up.connect(socket_path)
        except OSError:
            conn.close()
            return
        back = threading.Thread(target=pump, args=(up, conn), daemon=True)
        back.start()
        pump(conn, up)
        back.join()
        conn.close()
        up.close()

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True, name="bridge")
    t.start()
    return t


class Init:
    def __init__(self, ctl: socket.socket):
        self.ctl = ctl
        self.services: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}
        self.lock = threading.Lock()
        self.spawn_lock = threading.Lock()      # held from fork to ``tracked``: the reaper never takes a Popen's child
        self.tracked: set[int] = set()

    def send(self, msg: dict) -> None:
        data = (json.dumps(msg) + "\n").encode()
        with self.lock:
            self.ctl.sendall(data)

    # --- processes -------------------------------------------------------------------------------------------
    def spawn(self, argv: list[str], **kw) -> subprocess.Popen:
        with self.spawn_lock:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True, **kw)
            self.tracked.add(proc.pid)
        return proc

    def reap_orphans(self) -> None:
        """Collect the exit status of zombies that are not a Popen's: pid 1 inherits every orphan."""
        with self.spawn_lock:
            for pid, (ppid, state) in _procs().items():
                if ppid == os.getpid() and state == "Z" and pid not in self.tracked:
                    try:
                        os.waitpid(pid, os.WNOHANG)
                    except ChildProcessError:
                        pass

    def reaper(self) -> None:
        while True:
            time.sleep(1.0)
            self.reap_orphans()

    def _keep(self) -> set[int]:
        """init and the services with every descendant of a service."""
        tree = {p.pid for p in self.services.values() if p.poll() is None}
        procs = _procs()
        grew = True
        while grew:
            grew = False
            for pid, (ppid, _) in procs.items():
                if ppid in tree and pid not in tree:
                    tree.add(pid)
                    grew = True
        return tree | {os.getpid()}

    def _alive(self, name: str, proc: subprocess.Popen) -> bool:
        """Running and, if it has a port, still accepting: a process killed a moment ago may not be reaped yet."""
        if proc.poll() is not None:
            return False
        port = self.ports.get(name)
        if port is None:
            return True
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return proc.poll() is None and _wait_exit(proc, 0.5)

    def kill_strays(self) -> tuple[int, list[str]]:
        """Kill every process in the namespace but init and the services' trees, until none is left or KILL_CAP_S
        passed; returns how many were killed and who survived. Each round first stops everything with
        ``kill(-1, SIGSTOP)``, which the kernel makes atomic against fork, so a fork bomb cannot outrun it; the
        services (stopped too, for a moment) are continued at the end, also when the harness had stopped them."""
        deadline = time.monotonic() + KILL_CAP_S
        killed: set[int] = set()
        while True:
            try:
                os.kill(-1, signal.SIGSTOP)
            except ProcessLookupError:
                pass                                 # nothing but init is left
            keep = self._keep()
            victims = [pid for pid in _procs() if pid not in keep]
            if not victims or time.monotonic() > deadline:
                break
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.002)
            self.reap_orphans()
        for pid in keep - {os.getpid()}:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        return len(killed), [_describe(pid) for pid in victims]

    def run(self, req: dict) -> dict:
        env = req.get("env") or {}
        if req.get("clean"):
            # The verifier: only once nothing of the harness runs, in a HOME and TMPDIR made for it now.
            killed, left = self.kill_strays()
            if left:
                return {"exit_code": None, "timed_out": False, "duration_s": 0.0, "strays_left": left,
                        "stdout": "", "stderr": _b64(b"not started: processes still running: " + str(left).encode())}
            _fresh_folder(req["clean"], env)
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        t0 = time.monotonic()
        try:
            proc = self.spawn(req["argv"], env=env, cwd=req.get("cwd") or None, stdout=out, stderr=err)
        except OSError as exc:
            return {"exit_code": 127, "timed_out": False, "duration_s": 0.0, "stdout": "",
                    "stderr": _b64(f"could not start {req['argv'][0]!r}: {exc}\n".encode())}
        timed_out = False
        try:
            code = proc.wait(timeout=req.get("timeout_s"))
        except subprocess.TimeoutExpired:
            timed_out = True
            _killpg(proc.pid)
            proc.wait()
            code = None
        finally:
            self.tracked.discard(proc.pid)
        duration = time.monotonic() - t0
        killed, left = self.kill_strays()
        alive = {name: self._alive(name, p) for name, p in self.services.items()}
        return {"exit_code": code, "timed_out": timed_out, "duration_s": duration, "strays_killed": killed,
                "strays_left": left, "services": alive, "stdout": _b64(_tail(out)), "stderr": _b64(_tail(err))}

    def sweep(self, req: dict) -> dict:
        """Replace each link under ``root`` that resolves into one of ``into`` (folders the harness never saw:
        the tests, the reward folder) by an empty file: run once the harness is dead, so a naive verifier that
        opens ``answer.txt`` reads what the harness wrote, never the task's own expectations."""
        into = [p.rstrip("/") for p in req["into"]]
        swept = []
        for top, dirs, files in os.walk(req["root"]):
            for path in (os.path.join(top, name) for name in dirs + files):
                real = os.path.realpath(path)
                if os.path.islink(path) and any(real == p or real.startswith(p + "/") for p in into):
                    os.unlink(path)
                    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                    swept.append(path)
        return {"swept": swept}

    def start(self, req: dict) -> dict:
        name = req["name"]
        log = open(f"/tmp/.service-{name}.log", "wb")
        proc = self.spawn(req["argv"], env=req.get("env") or {}, cwd=req.get("cwd") or None, stdout=log,
                          stderr=subprocess.STDOUT)
        self.services[name] = proc
        if req.get("ready_port"):
            self.ports[name] = int(req["ready_port"])
        port, deadline = req.get("ready_port"), time.monotonic() + float(req.get("timeout_s") or 10)
        while port:
            if proc.poll() is not None:
                return {"exit_code": proc.returncode, "timed_out": False, "stderr": _b64(_read_log(name))}
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    return {"exit_code": None, "timed_out": True, "stderr": _b64(_read_log(name))}
                time.sleep(0.02)
        return {"exit_code": 0, "timed_out": False, "pid": proc.pid}

    def handle(self, req: dict) -> dict:
        op = req.get("op")
        if op == "run":
            return self.run(req)
        if op == "start":
            return self.start(req)
        if op == "sweep":
            return self.sweep(req)
        if op == "write":
            path = req["path"]
            os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
            with open(path, "wb") as f:
                f.write(base64.b64decode(req["data"]))
            os.chmod(path, int(req.get("mode", 0o644)))
            return {"ok": True}
        if op == "read":
            try:
                with open(req["path"], "rb") as f:
                    return {"data": _b64(f.read())}
            except OSError as exc:
                return {"error": f"{type(exc).__name__}: {exc}"}
        if op == "logs":
            return {"data": _b64(b"".join(_read_log(n) for n in self.services))}
        if op == "ping":
            return {"pid": os.getpid()}
        return {"error": f"unknown op {op!r}"}

    def serve(self) -> None:
        buf = b""
        self.send({"ready": True, "pid": os.getpid()})
        while True:
            chunk = self.ctl.recv(1 << 20)
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                try:
                    resp = self.handle(req)
                except Exception as exc:  # reported to the host, which classifies it; init keeps serving
                    resp = {"error": f"{type(exc).__name__}: {exc}"}
                resp["id"] = req.get("id")
                self.send(resp)


def _procs() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process in the namespace."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
                fields = stat[stat.rindex(b")") + 2:].split()
                out[int(name)] = (int(fields[1]), fields[0].decode())
            except (OSError, ValueError, IndexError):
                pass
    return out


def _describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        return f"{pid} ({stat[stat.index('(') + 1:stat.rindex(')')]}) state {stat[stat.rindex(')') + 2]}"
    except (OSError, ValueError, IndexError):
        return f"{pid} (gone)"


def _fresh_folder(path: str, env: dict) -> None:
    """Make ``path`` a new empty folder holding the phase's HOME and TMPDIR (``env`` names them): whatever the
    harness left at that path is moved aside first, never reused."""
    if os.path.lexists(path):
        os.rename(path, os.path.join(tempfile.mkdtemp(prefix=".left-by-harness-", dir=os.path.dirname(path)), "x"))
    os.mkdir(path, 0o700)
    for key in ("HOME", "TMPDIR"):
        if env.get(key, "").startswith(path + "/"):
            os.makedirs(env[key], 0o700, exist_ok=True)


def _wait_exit(proc: subprocess.Popen, seconds: float) -> bool:
    """True if ``proc`` is still running after ``seconds`` (it refused a connection but did not exit)."""
    try:
        proc.wait(timeout=seconds)
        return False
    except subprocess.TimeoutExpired:
        return True


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(f) -> bytes:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - TAIL_BYTES))
    return f.read()


def _read_log(name: str) -> bytes:
    try:
        with open(f"/tmp/.service-{name}.log", "rb") as f:
            return f.read()[-TAIL_BYTES:]
    except OSError:
        return b""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def main(argv: list[str] | None = None) -> int:
    # --ctl-fd N [--bridge-port P --bridge-socket PATH] [--fsize-mb M]; no argparse (it costs ~10 ms to import)
    argv = sys.argv[1:] if argv is None else argv
    opts = dict(zip(argv[::2], argv[1::2]))
    args = types.SimpleNamespace(ctl_fd=int(opts["--ctl-fd"]), bridge_port=int(opts.get("--bridge-port", 0)),
                         bridge_socket=opts.get("--bridge-socket", ""), fsize_mb=int(opts.get("--fsize-mb", 0)))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if args.fsize_mb:
        limit = args.fsize_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    ctl = socket.socket(fileno=args.ctl_fd)
    os.set_inheritable(args.ctl_fd, False)
    if args.bridge_port and args.bridge_socket:
        _relay_thread(args.bridge_port, args.bridge_socket)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)      # no handler: pid 1 then ignores it from inside
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    init = Init(ctl)
    threading.Thread(target=init.reaper, daemon=True, name="reaper").start()
    init.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
