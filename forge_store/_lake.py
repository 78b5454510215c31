"""The data-lake tier: incremental snapshots by watermark into partitioned Parquet, for DuckDB, Spark or Trino.

A lake is a folder or an ``s3://bucket/prefix`` URL that holds one store's rows as Hive-partitioned Parquet::

    <lake>/<table>/lake_wm=<W>/part-00000.parquet    the rows that changed in (previous W, W]
    <lake>/_snapshots/<W, 12 digits>.json            the snapshot's manifest, written LAST

``W`` is the store's ingest watermark the snapshot ran to (an integer partition column for every reader; the
manifest's name is zero-padded so manifests list in order). Each snapshot
adds one partition per table holding only the rows written (``ingest_seq``) in its watermark range, plus a new
version of every rollout that finished in it (``finished_seq``; a rollout still running at ``W`` is written as
running, exactly as a snapshot pinned to ``W`` shows it): old partitions are never rewritten. A reader takes a
table's rows from the partitions whose manifest exists (a snapshot that died before its manifest is not part of
the lake, and the next snapshot deletes its files before writing), and a rollout's latest version is the one with
the highest ``lake_wm``. ``store_meta`` is not a lake table (the store id is in every manifest).

A run writes its files in a local staging folder, puts them into the lake (each put atomic), then its manifest with
a conditional put. One lake has one writer at a time; a run that finds, before its uploads or its manifest, that
another writer added a snapshot since it started stops (``LakeError``) and removes what it put.

Why Parquet and not Apache Iceberg: see docs/data-lake.md (pyiceberg's SQL catalog was checked).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from . import _schema as schema
from ._errors import StoreError
from ._hashing import sha256_hex
from ._objstore import Location, is_url, open_location
from ._settings import Settings
from ._snapshot import _write_table
from ._tombstones import NOT_COPIED, record_copy

FORMAT = "openforge-lake"
FORMAT_VERSION = 1
PARTITION = "lake_wm"
MANIFESTS = "_snapshots"
SKIPPED = ("ingest_counter", "store_meta", *NOT_COPIED)
_PART = re.compile(rf"^([a-z_]+)/{PARTITION}=(\d+)/")


class LakeError(StoreError):
    """The lake cannot take this snapshot (another store's lake, a watermark behind the lake's)."""


def lake_tables() -> list[sa.Table]:
    return [t for t in schema.Base.metadata.sorted_tables if t.name not in SKIPPED]


def wm_key(wm: int) -> str:
    return f"{wm:012d}"


def lake_manifests(lake: Location) -> list[dict]:
    """The complete snapshots of a lake, oldest first."""
    return [json.loads(lake.get_bytes(k)) for k in lake.list(MANIFESTS + "/") if k.endswith(".json")]


def lake_snapshot(engine: sa.Engine, lake_url: str | os.PathLike, *, as_of: int | None = None,
                  settings: Settings | None = None, progress: Callable[[str, int], None] | None = None,
                  uploaded: Callable[[str], None] | None = None, batch_rows: int = 5000) -> dict:
    """Add the rows that changed since the lake's last snapshot (up to ``as_of``, default: now); return the new
    manifest, or the last one when nothing changed since it."""
    lake = open_location(lake_url, settings)
    done = lake_manifests(lake)
    with engine.connect() as conn:
        store_id = conn.execute(sa.select(schema.StoreMeta.value).where(schema.StoreMeta.key == "store_id")
                                ).scalar_one()
        current = conn.execute(sa.select(schema.IngestCounter.value)).scalar_one()
        wm = current if as_of is None else as_of
        if wm > current:
            raise LakeError(f"--as-of {wm}: the store's watermark is only {current}; pin to one it has reached")
        prev = done[-1]["to_watermark"] if done else 0
        if done and done[-1]["store_id"] != store_id:
            raise LakeError(f"the lake at {lake.url} holds store {done[-1]['store_id']}, not {store_id}: a lake "
                            "holds one store; pick another lake URL for this one")
        if wm < prev:
            raise LakeError(f"--as-of {wm} is behind the lake at {lake.url}, which already reaches watermark {prev}; "
                            "a lake only grows: pin to a later watermark or start a new lake")
        if done and wm == prev:
            return done[-1]
        _drop_unfinished(lake, prev)
        with tempfile.TemporaryDirectory(prefix="openforge-lake-") as tmp:
            staging, tables = Path(tmp), {}
            for table in lake_tables():
                rel = f"{table.name}/{PARTITION}={wm}/part-00000.parquet"
                path = staging / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                n = _write_table(conn, table, path, wm, progress, batch_rows, since=prev)
                tables[table.name] = {"path": rel, "rows": n, "sha256": sha256_hex(path.read_bytes())}
            manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "store_id": store_id,
                        "from_watermark": prev, "to_watermark": wm, "partition": f"{PARTITION}={wm}",
                        "tables": tables}
            _still_last(lake, prev)
            for info in tables.values():
                lake.put_file(info["path"], staging / info["path"])
                if uploaded:
                    uploaded(info["path"])
    marker = f"{MANIFESTS}/{wm_key(wm)}.json"
    try:
        _still_last(lake, prev)
        if not lake.put_bytes(marker, json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n", create=True):
            raise LakeError(f"{lake.url}/{marker} was written by another writer while this one ran (a lake has one "
                            "writer at a time); run it again when that one is done")
    except LakeError:
        for info in tables.values():
            lake.delete(info["path"])
        raise
    if uploaded:
        uploaded(marker)
    record_copy(engine, lake.url if is_url(str(lake_url)) else str(Path(lake_url).resolve()), "lake")
    return manifest


def _still_last(lake: Location, prev: int) -> None:
    """LakeError unless the lake's last manifest is still the one this run started after."""
    now = lake_manifests(lake)
    if (now[-1]["to_watermark"] if now else 0) != prev:
        raise LakeError(f"another writer added a snapshot to the lake at {lake.url} while this one ran (a lake has "
                        "one writer at a time); run it again when that one is done")


def _drop_unfinished(lake: Location, prev: int) -> None:
    """Delete partitions past the last manifest: a snapshot that died before its manifest left them."""
    for key in lake.list():
        m = _PART.match(key)
        if m and int(m.group(2)) > prev:
            lake.delete(key)


def lake_sql(root: str, table: str) -> str:
    """DuckDB SQL for ``table``'s rows in the complete snapshots of the lake at ``root`` (a folder or s3:// URL;
    for s3 DuckDB needs its httpfs extension and an S3 secret). Rollouts: each one's latest version."""
    rows = (f"SELECT * FROM read_parquet('{root}/{table}/*/*.parquet', hive_partitioning = true, union_by_name = true) "
            f"WHERE {PARTITION} IN (SELECT to_watermark FROM read_json_auto('{root}/{MANIFESTS}/*.json'))")
    if table == "rollouts":
        rows += f" QUALIFY row_number() OVER (PARTITION BY id ORDER BY {PARTITION} DESC) = 1"
    return rows

