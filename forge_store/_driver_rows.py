"""Rows straight from the database driver, for the store's bulk reads (exports, analysis).

SQLAlchemy's result rows cost a few microseconds each (a ``Row`` per tuple, a type processor per typed column);
over a million calls that was most of an export's read. Bulk reads whose columns need no conversion (ids, integers,
token arrays as bytes, JSON cast to text) take the driver's tuples instead, through the connection's own DBAPI
connection, so they run inside the same transaction as the rest of the read.
"""

from __future__ import annotations

import re

import sqlalchemy as sa

_NAMED = re.compile(r"(?<![:\w]):(\w+)")  # ":name" but not a PostgreSQL "::type" cast


def driver_rows(conn: sa.Connection, sql: str, params: dict) -> list[tuple]:
    """Every row of ``sql`` (``:name`` placeholders, as ``sa.text`` takes them) as the driver's tuples: bytes for
    binary columns, str for text, int / bool / float as the driver gives them; no datetime or JSON decoding."""
    cursor = conn.connection.cursor()
    try:
        if conn.dialect.name == "postgresql":
            # binary results: a bytea column arrives as its bytes instead of hex text psycopg decodes (a third of
            # the read of a run of calls); the values are the same
            cursor.execute(_NAMED.sub(r"%(\1)s", sql.replace("%", "%%")), params, binary=True)
        else:
            cursor.execute(sql, params)
        return cursor.fetchall()
    finally:
        cursor.close()
