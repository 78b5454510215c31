"""Parquet snapshots of every table, pinned to a watermark, readable with DuckDB, pandas and pyarrow.

One file per table, written with fixed Parquet settings in primary-key order, then ``manifest.json`` last (its
presence proves the snapshot is complete). JSON columns become canonical JSON text; token arrays stay binary.
``out`` is a folder or an ``s3://bucket/prefix`` URL: for a URL the files are written to a local staging folder,
uploaded one by one (each put atomic), and the manifest is uploaded after the last of them, so a server that goes
away mid-snapshot leaves whole objects and no manifest.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa

from . import _schema as schema
from ._hashing import canonical_json, sha256_hex
from ._objstore import Location, is_url, open_location
from ._settings import Settings
from ._tombstones import NOT_COPIED, record_copy

FORMAT_VERSION = 1
_ROLLOUT_FINISH_COLUMNS = ("outcome", "outcome_detail", "ended_at", "finished_seq")


def _arrow_type(col: sa.Column) -> pa.DataType:
    t = col.type
    if isinstance(t, schema.UTCDateTime) or isinstance(t, sa.DateTime):
        return pa.timestamp("us", tz="UTC")
    if isinstance(t, sa.Boolean):
        return pa.bool_()
    if isinstance(t, sa.BigInteger):
        return pa.int64()
    if isinstance(t, sa.Integer):
        return pa.int64()
    if isinstance(t, sa.Float):
        return pa.float64()
    if isinstance(t, sa.LargeBinary):
        return pa.binary()
    return pa.string()  # String, Text, JSON (as canonical JSON text)


def _converter(col: sa.Column) -> Callable:
    if isinstance(col.type, (sa.JSON, schema.StoredJSON)):
        return _json_text
    return lambda v: v


def _json_text(value) -> str | None:
    if value is None:
        return None
    try:
        return canonical_json(value).decode()
    except ValueError:  # NaN or Infinity, which a metadata dict may hold: as stored (DuckDB's JSON reads them)
        return json.dumps(value, sort_keys=True, separators=(",", ":"))


def snapshot(engine: sa.Engine, out_dir: str | os.PathLike, *, as_of: int | None = None,
             progress: Callable[[str, int], None] | None = None, batch_rows: int = 5000,
             settings: Settings | None = None, uploaded: Callable[[str], None] | None = None) -> dict:
    """Write every table as Parquet under ``out_dir`` (a folder or ``s3://`` URL); return the manifest (also
    written as manifest.json, last). ``uploaded(name)`` is called after each object put to a URL."""
    if is_url(out_dir):
        with tempfile.TemporaryDirectory(prefix="openforge-snapshot-") as staging:
            manifest = _snapshot(engine, staging, as_of, progress, batch_rows)
            files = [info["file"] for info in manifest["tables"].values()]
            dest = open_location(str(out_dir), settings)
            publish(Path(staging), dest, files, "manifest.json", uploaded)
        record_copy(engine, dest.url, "snapshot")   # an erasure finds it there
        return manifest
    manifest = _snapshot(engine, out_dir, as_of, progress, batch_rows)
    record_copy(engine, str(Path(out_dir).resolve()), "snapshot")
    return manifest


def _snapshot(engine: sa.Engine, out_dir, as_of: int | None, progress, batch_rows: int) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with engine.connect() as conn:
        watermark = conn.execute(sa.select(schema.IngestCounter.value)).scalar_one()
        store_id = conn.execute(
            sa.select(schema.StoreMeta.value).where(schema.StoreMeta.key == "store_id")
        ).scalar_one()
        as_of = watermark if as_of is None else as_of
        tables = {}
        for table in schema.Base.metadata.sorted_tables:
            if table.name in ("ingest_counter", *NOT_COPIED):
                continue
            path = out / f"{table.name}.parquet"
            n = _write_table(conn, table, path, as_of, progress, batch_rows)
            tables[table.name] = {"file": path.name, "rows": n, "sha256": sha256_hex(path.read_bytes())}
    manifest = {"format": "openforge-snapshot", "format_version": FORMAT_VERSION, "store_id": store_id,
                "watermark": as_of, "tables": tables}
    tmp = out / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out / "manifest.json")
    return manifest


def publish(staging: Path, dest: Location, files: list[str], marker: str,
            uploaded: Callable[[str], None] | None = None) -> None:
    """Upload ``files`` (relative to ``staging``) to ``dest``, then ``marker`` LAST: its presence proves the rest."""
    for name in [*files, marker]:
        dest.put_file(name, staging / name)
        if uploaded:
            uploaded(name)


def _write_table(conn, table: sa.Table, path: Path, as_of: int, progress, batch_rows: int,
                 since: int | None = None) -> int:
    """Rows as of ``as_of``; with ``since``, only those that changed after it: written (ingest_seq) or, for a
    rollout, finished (finished_seq) in ``(since, as_of]`` (the lake's incremental range)."""
    cols = list(table.columns)
    arrow_schema = pa.schema([pa.field(c.name, _arrow_type(c), nullable=True) for c in cols])
    convert = [_converter(c) for c in cols]
    q = sa.select(table).order_by(*table.primary_key.columns)
    if "ingest_seq" in table.c:
        q = q.where(table.c.ingest_seq <= as_of)
        if since is not None:
            changed = table.c.ingest_seq > since
            if "finished_seq" in table.c:
                changed = changed | ((table.c.finished_seq > since) & (table.c.finished_seq <= as_of))
            q = q.where(changed)
    finish_idx = [i for i, c in enumerate(cols) if c.name in _ROLLOUT_FINISH_COLUMNS] if table.name == "rollouts" else []
    status_idx = next((i for i, c in enumerate(cols) if c.name == "status"), None)
    fseq_idx = next((i for i, c in enumerate(cols) if c.name == "finished_seq"), None)
    n = 0
    with pq.ParquetWriter(path, arrow_schema, compression="zstd", write_statistics=True) as writer:
        result = conn.execution_options(yield_per=batch_rows).execute(q)
        for part in result.partitions():
            columns = [[] for _ in cols]
            for row in part:
                values = list(row)
                if finish_idx and values[fseq_idx] is not None and values[fseq_idx] > as_of:
                    for i in finish_idx:
                        values[i] = None
                    values[status_idx] = "running"
                for i, v in enumerate(values):
                    columns[i].append(convert[i](v))
            writer.write_batch(pa.record_batch(columns, schema=arrow_schema))
            n += len(part)
            if progress:
                progress(table.name, len(part))
    return n
