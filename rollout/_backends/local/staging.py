"""What the host prepares for each sandbox under the backend's root, as the sandbox user can reach it.

When the orchestrator runs as root, bubblewrap runs as an unprivileged user (``run_as``) who can bind only what
``nobody`` can reach: a private folder above a task or a harness install would break the mount, so a readable file
there is copied under the root and a task's environment folder is copied per rollout. Copying never widens who can
read a file: a file the task made private stays unreadable inside, as it would be in place.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import threading
from pathlib import Path

from ..base import Mount, Phase, SandboxError, SandboxSpec
from .bwrap import INIT_PATH, INIT_SCRIPT, SANDBOX_HOME, SANDBOX_UID, Bind


class Staging:
    """Host folders under ``root``: ``root/<rollout id>/`` per sandbox, ``root/.files`` for copied single files."""

    def __init__(self, root: Path, run_as: int | None):
        self.root, self.run_as = root, run_as
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)
        if run_as is not None and not reachable(self.root, read=False):
            raise SandboxError(f"sandbox folder {self.root}: the unprivileged sandbox user cannot reach it (a folder "
                               f"above it is not searchable by others, e.g. a private /root or mktemp checkout); set "
                               f"OPENFORGE_SANDBOX_DIR to a folder such as /var/tmp/openforge/sandboxes",
                               kind="sandbox_setup")
        self._files = self.root / ".files"       # copies of single files the sandbox user could not reach

    def prepare(self, d: Path, spec: SandboxSpec) -> tuple[Path, list[Bind]]:
        """Make sandbox folder ``d`` (workspace, HOME, its own /etc files, empty per-phase staging folders); returns
        the folder of those /etc files and what to bind, in mount order."""
        d.mkdir(mode=0o711)
        ws, home, etc = d / "workspace", d / "home", d / "etc"
        if spec.workspace_seed is not None:
            shutil.copytree(spec.workspace_seed, ws, symlinks=True)
        else:
            ws.mkdir()
        home.mkdir()
        etc.mkdir()
        self.own(ws)
        self.own(home)
        _identity(etc)
        binds = [Bind(ws, spec.workdir, True), Bind(home, SANDBOX_HOME, True),
                 Bind(self.visible_file(INIT_SCRIPT), INIT_PATH)]
        if spec.environment_dir is not None:
            binds.append(Bind(self._environment(d, spec.environment_dir), "/environment"))
        binds += [Bind(self.visible(m.source), m.target, m.writable) for m in spec.mounts]
        for i, m in enumerate(phase_mounts(spec)):
            stage = d / "stage" / str(i)
            stage.mkdir(parents=True)
            binds.append(Bind(stage, m.target, m.writable))
        return etc, binds

    def fill(self, d: Path, spec: SandboxSpec, phase: Phase) -> list[Path]:
        """Fill this phase's staging folders; they were bind-mounted (empty) when the sandbox was created. Each is
        emptied first: when the host is not root the sandbox user owns a writable one and may have written there."""
        staged = []
        targets = {m.target: i for i, m in enumerate(phase_mounts(spec))}
        for m in phase.mounts:
            stage = d / "stage" / str(targets[m.target])
            _empty(stage)
            if m.source is not None and Path(m.source).is_dir():
                shutil.copytree(m.source, stage, symlinks=True, dirs_exist_ok=True)
                if self.run_as is not None and not m.writable:
                    searchable_dirs(stage)
            if m.writable:
                self.own(stage)
            staged.append(stage)
        return staged

    def empty(self, staged: list[Path]) -> None:
        """Empty the staging folders ``fill`` returned and give them back to root."""
        for stage in staged:
            if not stage.exists():
                continue
            _empty(stage)
            if self.run_as is not None:
                os.chown(stage, 0, 0)

    def seal(self, ws: Path, *, step: str) -> None:
        """The workspace as the harness left it, made fit for the verifier once every harness process is dead.

        ``step="open"``: every folder enterable and writable by its owner (the sandbox user), whatever modes the
        harness set (``chmod 000``), so ``sandbox_init`` can sweep it. ``step="read-only"``: as root, everything is
        given to root, readable and not writable by others (the sandbox user); not as root the sandbox user owns
        every file (one uid is all an unprivileged user namespace maps), so write bits are removed but it could put
        them back: read-only is then a convention, not enforced. Walks by folder descriptor (``os.fwalk``) and never
        chmods a link: nothing here follows a path the sandbox could have swapped."""
        if step == "open":
            _enterable(ws)
            return
        root = self.run_as is not None

        def fix(name: str, dir_fd: int | None) -> None:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if root:
                os.chown(name, 0, 0, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                return
            keep = 0o755 if root else 0o555              # drops set-id bits and every write bit but root's
            add = 0o555 if stat.S_ISDIR(st.st_mode) else 0o444
            os.chmod(name, (stat.S_IMODE(st.st_mode) | add) & keep, dir_fd=dir_fd)

        fix(str(ws), None)
        for _, dirs, files, dfd in os.fwalk(ws, follow_symlinks=False):
            for name in dirs + files:
                fix(name, dfd)

    def remove(self, d: Path) -> None:
        """Remove sandbox folder ``d``; not as root, first make enterable what the sandbox user (who owns it all
        then) made private or the seal made read-only."""
        if self.run_as is None and d.exists():
            _enterable(d)
        shutil.rmtree(d, ignore_errors=True)

    def own(self, path: Path) -> None:
        """Give ``path`` (and all below it) to the sandbox user, so the harness may write there."""
        if self.run_as is None:
            return
        os.chown(path, self.run_as, self.run_as)
        for p in path.rglob("*"):
            os.lchown(p, self.run_as, self.run_as)

    def visible(self, source: Path) -> Path:
        """``source`` as the sandbox user can bind it: as is when reachable, a copy for a file, else an error."""
        if self.run_as is None or reachable(source):
            return source
        if Path(source).is_file():
            return self.visible_file(source)
        raise SandboxError(f"mount source {source}: the unprivileged sandbox user cannot reach it (a folder above it "
                           f"is private); install it under a world-readable folder (as root the harness installs go "
                           f"to /var/cache/openforge, OPENFORGE_CACHE_DIR)", kind="sandbox_setup")

    def visible_file(self, source: Path) -> Path:
        """A file others may read whose folder is private gets a copy under the sandbox root; any other file is
        bound as it is (a private file stays private: copying must never widen who can read it)."""
        if self.run_as is None or reachable(source) or not source.stat().st_mode & 0o004:
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

    def _environment(self, d: Path, env_dir: Path) -> Path:
        if self.run_as is None or reachable(env_dir):
            return env_dir
        copy = d / "environment"          # a task in a private folder: this rollout gets a copy
        shutil.copytree(env_dir, copy, symlinks=True)
        searchable_dirs(copy)
        return copy


def _identity(etc: Path) -> None:
    """The sandbox's own passwd, group and hosts (bwrap.OWN_ETC_FILES): the harness is ``agent``, the host is
    ``sandbox``."""
    (etc / "passwd").write_text(f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                                f"agent:x:{SANDBOX_UID}:{SANDBOX_UID}:agent:{SANDBOX_HOME}:/bin/bash\n"
                                f"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    (etc / "group").write_text(f"root:x:0:\nagent:x:{SANDBOX_UID}:\nnogroup:x:65534:\n")
    (etc / "hosts").write_text("127.0.0.1 localhost sandbox\n::1 localhost\n")


class NotRegular(Exception):
    """An output that is there but is not a regular file (a link, a folder, a fifo...) or is too large."""


def read_regular(folder: Path, rel: str, limit: int) -> bytes | None:
    """``rel`` under host ``folder``, every component opened without following a link; None when absent."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        *parents, name = rel.split("/")
        for part in parents:
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise NotRegular(f"{part} is a link or not a folder ({exc.strerror})") from None
            os.close(fd)
            fd = nfd
        try:
            f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise NotRegular("a symbolic link" if exc.errno == errno.ELOOP else exc.strerror) from None
        st = os.fstat(f)
        if not stat.S_ISREG(st.st_mode):
            os.close(f)
            raise NotRegular(f"not a regular file (mode {stat.filemode(st.st_mode)})")
        with os.fdopen(f, "rb") as fh:
            data = fh.read(limit + 1)
        if len(data) > limit:
            raise NotRegular(f"larger than {limit} bytes")
        return data
    finally:
        os.close(fd)


def _empty(folder: Path) -> None:
    """Remove everything in ``folder`` whatever modes its folders have (the sandbox user may have set 000)."""
    for p in folder.iterdir() if folder.exists() else []:
        if p.is_dir() and not p.is_symlink():
            _enterable(p)
            shutil.rmtree(p)
        else:
            p.unlink()


def _enterable(top: Path) -> None:
    """Every folder from ``top`` down enterable and writable by its owner, set before the walk enters it."""
    os.chmod(top, stat.S_IMODE(os.lstat(top).st_mode) | 0o700)
    for _, dirs, _, dfd in os.fwalk(top, follow_symlinks=False):
        for name in dirs:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                os.chmod(name, stat.S_IMODE(st.st_mode) | 0o700, dir_fd=dfd)


def phase_mounts(spec: SandboxSpec) -> list[Mount]:
    """Every phase's mounts, one per target (the first phase that names a target decides it)."""
    seen, out = set(), []
    for ph in spec.phases:
        for m in ph.mounts:
            if m.target not in seen:
                seen.add(m.target)
                out.append(m)
    return out


def searchable_dirs(root: Path) -> None:
    """Let others search the folders of a root-made copy. File modes are kept: a file the task made private stays
    unreadable to the sandbox user, as it would be in place."""
    for p in [root, *root.rglob("*")]:
        if p.is_dir() and not p.is_symlink():
            os.chmod(p, p.stat().st_mode | 0o055)


def reachable(path: Path, *, read: bool = True) -> bool:
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
