"""The other workers of one ``openforge proxy --workers N`` (``Siblings``), reached one by one on their private
admin sockets, and the proxy-wide state a worker starts in.

Every worker serves its app on the supervisor's one port and on a Unix socket of its own, ``<run dir>/<replica
id>.sock`` (the run folder is the supervisor's, owner-only, made fresh for each run). A worker that answers a
proxy-wide admin call (``proxy._fleet``) applies it and forwards it to each sibling's socket, marked
``X-OpenForge-Forwarded-By`` so that the sibling applies it to itself only; the admin token is checked there as on
the port. A sibling that does not answer in time, or refuses, is named in the error (``SiblingError``).

A socket nobody listens on is a worker that is dead or not started: the supervisor restarts it, and the new one
reads ``state.json`` (written before each fan-out: pause, active policy version, the engine replicas' admission)
*after* binding its socket and before it serves, so it comes up in the current state: either it read the state
after the write, or its socket was bound before the fan-out looked, and the forwarded call waits in its backlog
until it serves. ``admin.lock`` (flock) makes proxy-wide changes one at a time across workers.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson

from ._errors import ProxyError

FORWARDED = "x-openforge-forwarded-by"  # on a forwarded admin call: the replica id of the worker that fans out
TIMEOUT_S = 30.0  # a sibling that has not answered a forwarded call by then is reported as failed


@dataclass
class Answer:
    """One sibling's answer to a forwarded call: its JSON (``body``) or why there is none (``error``)."""

    status: int | None
    body: dict | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200 and self.body is not None


class SiblingError(ProxyError):
    """A proxy-wide admin call that did not take effect on every live worker; the message names them."""

    def __init__(self, message: str, failed: dict[str, str]):
        super().__init__(503, message, type="server_error", code="worker_failed")
        self.failed = failed


def failures(answers: dict[str, Answer]) -> dict[str, str]:
    """replica id -> what went wrong, for the siblings whose answer was not a 200."""
    out = {}
    for rid, a in answers.items():
        if not a.ok:
            detail = ((a.body or {}).get("error") or {}).get("message") or "not a JSON object"
            out[rid] = a.error or f"answered {a.status}: {detail}"
    return out


def named(failed: dict[str, str]) -> str:
    return "; ".join(f"worker {rid}: {why}" for rid, why in sorted(failed.items()))


def bind_private(run_dir: Path, replica_id: str) -> socket.socket:
    """This worker's private admin socket, listening (calls forwarded before it serves wait in its backlog)."""
    path = Path(run_dir) / f"{replica_id}.sock"
    path.unlink(missing_ok=True)  # the socket of the worker this one replaces
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(64)
    return sock


class Siblings:
    """This worker (``replica_id``) among the workers whose sockets are in ``run_dir``."""

    def __init__(self, run_dir: Path, replica_id: str, admin_token: str):
        self.run_dir, self.replica_id, self.admin_token = Path(run_dir), replica_id, admin_token

    def forwarded(self, request) -> bool:
        """A call another worker forwarded here (marked, on the private socket: a Unix socket has no client
        address), to apply to this worker only. Marked on the port, it is fanned out as any other."""
        return request.headers.get(FORWARDED) is not None and request.scope.get("client") is None

    def others(self) -> list[str]:
        return sorted(p.stem for p in self.run_dir.glob("*.sock") if p.stem != self.replica_id)

    async def send(self, method: str, path: str, content: bytes | None = None, *,
                   timeout_s: float | None = None) -> dict[str, Answer]:
        """``method path`` (JSON ``content``) to every sibling at once; replica id -> its answer. A sibling whose socket
        nobody listens on is left out: it is dead or starting, and starts in the state file's state."""
        timeout = TIMEOUT_S if timeout_s is None else timeout_s
        ids = self.others()
        answers = await asyncio.gather(*(self._send(rid, method, path, content, timeout) for rid in ids))
        return {rid: a for rid, a in zip(ids, answers) if a is not None}

    async def _send(self, rid: str, method: str, path: str, content: bytes | None, timeout: float) -> Answer | None:
        transport = httpx.AsyncHTTPTransport(uds=str(self.run_dir / f"{rid}.sock"))
        headers = {"Authorization": f"Bearer {self.admin_token}", FORWARDED: self.replica_id,
                   "Content-Type": "application/json"}
        async with httpx.AsyncClient(transport=transport, base_url="http://worker", timeout=timeout) as client:
            try:
                r = await client.request(method, path, headers=headers, content=content)
            except (httpx.ConnectError, FileNotFoundError):  # nobody listens: dead or not started (see module doc)
                return None
            except httpx.TimeoutException:
                return Answer(None, None, f"no answer within {timeout:g}s")
            except httpx.HTTPError as exc:
                return Answer(None, None, f"{type(exc).__name__}: {exc}")
        try:
            parsed = r.json()
        except ValueError:
            parsed = None
        return Answer(r.status_code, parsed if isinstance(parsed, dict) else None)

    # ---- the proxy-wide state, for workers that start later ---------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.run_dir / "state.json"

    def read_state(self) -> dict | None:
        """The state the last proxy-wide change left (None before the first: the command line's)."""
        try:
            return orjson.loads(self.state_path.read_bytes())
        except FileNotFoundError:
            return None

    def write_state(self, state: dict) -> None:
        tmp = self.state_path.with_name(f".state-{self.replica_id}.json")
        tmp.write_bytes(orjson.dumps(state))
        os.replace(tmp, self.state_path)

    @asynccontextmanager
    async def exclusive(self):
        """One proxy-wide change at a time, across the workers (an flock on ``admin.lock``)."""
        fd = os.open(self.run_dir / "admin.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:  # asked again rather than waited for in a thread: no thread held, cancellable
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(0.02)
            yield
        finally:
            os.close(fd)  # closing releases the lock
