"""``wait_for_schema``: a writer's database side checks the schema before its first batch.

A store opened while its database was unreachable (``open_store(..., offline=True)``: the proxy starts, serves and
journals without it) could not check the schema revision at open; its writer does it here, once the database
answers, before it applies anything. An unreachable database is waited for (``wait``, as for a batch); a schema
this code cannot write to raises ``SchemaMismatch``, which says what to run, and nothing is applied meanwhile: the
journal keeps every write.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa

from .. import _migrate as migrate
from .._backoff import Backoff
from .._engine import redact_url
from .db_apply import TRANSIENT


def wait_for_schema(engine: sa.Engine, *, auto_upgrade: bool, retry_max_s: float, wait: Callable[[float], bool],
                    down: Callable[[], None]) -> bool:
    """True once the database is at this code's head revision (created first if it is empty and ``auto_upgrade``);
    False if ``wait(delay)`` said to stop while it was unreachable (``down()`` is called on each failed try)."""
    delays = Backoff(0.05, retry_max_s)
    url = redact_url(engine.url.render_as_string(hide_password=False))
    while True:
        try:
            migrate.check(engine, url, auto_upgrade=auto_upgrade)
            return True
        except TRANSIENT:
            down()
            if not wait(delays.next()):
                return False
