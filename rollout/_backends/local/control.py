"""The orchestrator's end of the control socket to ``sandbox_init``: newline-delimited JSON, bytes as base64.

The socket is inherited by the sandbox's first process (a socketpair, no path), so nothing the harness runs can
reach it. One request at a time: ``lock`` is held from send to answer.
"""

from __future__ import annotations

import base64
import json
import os
import select
import socket
import threading
import time


class Cancelled(Exception):
    """The caller's cancel event was set while waiting for an answer."""


class NoAnswer(Exception):
    """The deadline passed without an answer."""


class Closed(Exception):
    """``sandbox_init`` closed its end: the sandbox is gone."""


class Channel:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.lock = threading.Lock()
        self._buf = b""

    @classmethod
    def pair(cls) -> tuple[Channel, int]:
        """A channel and the inheritable fd of its other end (the caller closes the fd once the child holds it)."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fd = os.dup(child.fileno())
        child.close()
        os.set_inheritable(fd, True)
        return cls(parent), fd

    def send(self, req: dict) -> None:
        self.sock.sendall((json.dumps(req) + "\n").encode())

    def receive(self, *, deadline: float, cancel: threading.Event | None) -> dict:
        """The next answer; raises ``Cancelled``, ``NoAnswer`` (past ``deadline``) or ``Closed``."""
        while b"\n" not in self._buf:
            if cancel is not None and cancel.is_set():
                raise Cancelled
            left = deadline - time.monotonic()
            if left <= 0:
                raise NoAnswer
            ready, _, _ = select.select([self.sock], [], [], min(left, 0.1))
            if ready:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    raise Closed
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        self.sock.close()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(s: str | None) -> bytes:
    return base64.b64decode(s) if s else b""
