"""Reproducible exports: shards streamed with pyarrow, then an OpenLineage event, then ``manifest.json`` LAST.

Byte-identity (invariant 5): rows come in (group, rollout, segment) order; Parquet settings are fixed (zstd level
3, fixed row groups, no timestamps; only the format version in the schema metadata); the export id is the hash of
store id + watermark + config, so a re-run writes the same manifest and the same exclusion rows (idempotent ids).
The OpenLineage event's ``eventTime`` is the latest ``ended_at`` of the exported rollouts (data time, not wall
time), for the same reason. ``verify`` re-derives everything into a temporary folder and compares: files by
sha256, then the rows of each differing shard set by key (the veRL ``key``; rollout + segment; a group's prompt
row by group), so a dropped group reads as its rows missing, not as every later row changed.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from forge_store import Store, canonical_json, erased_rollouts, tombstones

from . import _columns as columns
from ._export_workers import default_workers, forkable, plan_in_workers
from ._formats import get_exporter
from ._plan import Exclusion, ExportConfig, ExportError, Planner
from ._rollout_correction import RolloutCorrected, manifest_entry
from ._rollout_facts import collector_paused
from ._export_notes import latest, note_lineage

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
OPENLINEAGE = "openlineage.json"


class ShardWriter:
    """Rows of one schema into ``{prefix}-00000.parquet``, ... with bounded memory (one row group buffered, and at
    most two more on their way to disk). With ``io`` (a one-thread executor shared by an export's writers) the
    Parquet encoding and compression run on that thread, in order, while the export plans the next rows: pyarrow
    releases the GIL while it writes."""

    PENDING = 1

    def __init__(self, out: Path, prefix: str, schema: pa.Schema, fmt: str, cfg: ExportConfig,
                 io: ThreadPoolExecutor | None = None):
        self.out, self.prefix, self.cfg, self.io = out, prefix, cfg, io
        self.schema = schema.with_metadata({"openforge.format": fmt, "openforge.format_version": str(FORMAT_VERSION)})
        self.storage = pa.schema([f.with_type(_storage_type(f.type)) for f in self.schema])
        self.buf: list[dict] = []
        self.files: list[tuple[str, int]] = []
        self.writer: pq.ParquetWriter | None = None
        self.in_shard = 0
        self.pending: deque[Future] = deque()
        self.tables: list[pa.Table] = []  # rows added as tables (add_table), not yet written
        self.n_tabled = 0

    def add(self, rows: list[dict]) -> None:
        self.buf += rows
        while len(self.buf) >= self.cfg.row_group_rows:  # every full row group, as it fills
            self._write(self.buf[:self.cfg.row_group_rows])
            del self.buf[:self.cfg.row_group_rows]

    def add_table(self, table: pa.Table) -> None:
        """Rows already built as a table of the storage schema (an export worker's), written in the same row
        groups as :meth:`add` writes them (the same rows in the same groups: the same bytes)."""
        self.tables.append(table)
        self.n_tabled += table.num_rows
        while self.n_tabled >= self.cfg.row_group_rows:
            whole = pa.concat_tables(self.tables)
            self._write(whole.slice(0, self.cfg.row_group_rows))
            rest = whole.slice(self.cfg.row_group_rows)
            self.tables, self.n_tabled = ([rest] if rest.num_rows else []), rest.num_rows

    def _run(self, fn: Callable, *args) -> None:
        """``fn(*args)`` on the io thread (now, without one); an error of an earlier write is raised here."""
        if self.io is None:
            fn(*args)
            return
        self.pending.append(self.io.submit(fn, *args))
        while self.pending and (len(self.pending) > self.PENDING or self.pending[0].done()):
            self.pending.popleft().result()

    def _write(self, rows: list[dict] | pa.Table) -> None:
        """``rows`` (dicts, or a table of the storage schema) into the current shard, the rest into the next when
        it fills."""
        while len(rows):
            if self.writer is None:
                name = f"{self.prefix}-{len(self.files):05d}.parquet"
                self.writer = pq.ParquetWriter(self.out / name, self.schema, compression="zstd", compression_level=3,
                                               version="2.6", use_dictionary=False, write_statistics=True)
                self.files.append((name, 0))
                self.in_shard = 0
            take = min(len(rows), self.cfg.rows_per_shard - self.in_shard)
            table = rows.slice(0, take).combine_chunks() if isinstance(rows, pa.Table) else columns.shard_table(rows[:take],
                                                                                                  self.storage)
            self._run(self.writer.write_table, table.cast(self.schema) if self.storage != self.schema else table)
            rows = rows.slice(take) if isinstance(rows, pa.Table) else rows[take:]
            self.in_shard += take
            self.files[-1] = (self.files[-1][0], self.in_shard)
            if self.in_shard >= self.cfg.rows_per_shard:
                self._run(self.writer.close)
                self.writer = None

    def close(self) -> list[tuple[str, int]]:
        self._write(self.buf)
        if self.tables:
            self._write(pa.concat_tables(self.tables))
        self.buf, self.tables, self.n_tabled = [], [], 0
        if self.writer is not None:
            self._run(self.writer.close)
            self.writer = None
        while self.pending:
            self.pending.popleft().result()
        return self.files


def _storage_type(t: pa.DataType) -> pa.DataType:
    """``t`` with every extension type (Arrow's JSON) replaced by its storage: rows are built from Python values in
    that form, then cast."""
    if isinstance(t, pa.BaseExtensionType):
        return t.storage_type
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_storage_type(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_storage_type(t.field(i).type)) for i in range(t.num_fields)])
    return t


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _software() -> dict:
    out = {"python": ".".join(map(str, sys.version_info[:3])), "pyarrow": pa.__version__}
    try:
        out["openforge"] = metadata.version("openforge")
    except metadata.PackageNotFoundError:
        out["openforge"] = None
    return out


def export_id_for(store_id: str, watermark: int, cfg: ExportConfig) -> str:
    return hashlib.sha256(canonical_json({"store": store_id, "watermark": watermark,
                                          "config": cfg.to_json()})).hexdigest()[:32]


def export(store: Store, out: Path | str, cfg: ExportConfig, *, as_of: int | None = None, record: bool = True,
           progress: Callable[[int, int], None] | None = None, batched: bool = True,
           workers: int | None = None) -> dict:
    """Write an export of ``cfg.format`` into ``out`` (created; must be empty) and return its manifest.

    ``batched=False`` reads every call in full and reconstructs it from Python lists (the reference path; SFT
    always reads that way): the same bytes, slower; tests pin the batched path to it. ``workers`` processes plan
    the runs of groups (:mod:`learner._export_workers`; None: one per core for a large store, 1: this process
    alone): the same bytes again."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"--out {out}: the folder is not empty; an export owns its folder. Pick a new folder "
                          "or remove this one.")
    out.mkdir(parents=True, exist_ok=True)
    wm = store.watermark() if as_of is None else as_of
    if wm > store.watermark():
        raise ExportError(f"--as-of {wm}: the store's watermark is only {store.watermark()}; pin to a watermark "
                          "the store has reached (openforge store info)")
    exporter = get_exporter(cfg.format)
    export_id = export_id_for(store.store_id, wm, cfg)

    def on_exclusion(e: Exclusion) -> None:
        if record:
            eid = hashlib.sha256(f"{export_id}|{e.reason}|{e.rollout_id}|{e.call_id}".encode()).hexdigest()[:32]
            store.add_exclusion(e.reason, rollout_id=e.rollout_id, call_id=e.call_id, detail=e.detail,
                                export_id=export_id, id=eid)

    planner = Planner(store, cfg, wm, on_exclusion, batched=batched)
    correction = None
    if cfg.rollout_is is not None:
        version = cfg.rollout_is_version or planner.current
        if version is None or version not in planner.policies:
            raise ExportError(f"--rollout-is-version {version!r} is not a policy version in the store as of watermark "
                              f"{wm}; pass the version the trainer starts from (known: "
                              f"{', '.join(planner.policies) or '(none)'})")
        exporter = RolloutCorrected(exporter, cfg, version)
        correction = manifest_entry(cfg, version)
    lineage: dict[str, set] = {k: set() for k in ("harnesses", "image_digests", "policy_versions",
                                                  "tool_schema_hashes", "verifier_versions", "reward_sources")}
    # the cycle collector paused (workers fork with it paused): an export allocates millions of short-lived,
    # acyclic containers, and the collections they set off took a fifth of its CPU (7.3 -> 6.0 s, bench store)
    with collector_paused(), ThreadPoolExecutor(1, thread_name_prefix="openforge-export-write") as io:
        writers = {p: ShardWriter(out, p, s, cfg.format, cfg, io) for p, s in exporter.schemas.items()}
        # asked-for workers too only where a fork is safe (see forkable): elsewhere this process plans alone
        n = default_workers(planner) if workers is None else max(1, workers) if forkable(planner) else 1
        if n > 1 and planner.n_runs() > 1:
            rows, data_time, exported_rollouts = plan_in_workers(planner, exporter, writers, lineage, n, progress)
        else:
            rows, data_time, exported_rollouts = _write_rows(planner, exporter, writers, lineage, progress)
        files = [{"path": name, "rows": n} for w in writers.values() for name, n in w.close()]
    t = planner.tally
    event = _openlineage(export_id, store.store_id, wm, cfg, data_time, [f["path"] for f in files])
    (out / OPENLINEAGE).write_bytes(canonical_json(event) + b"\n")
    files.append({"path": OPENLINEAGE, "rows": None})
    for f in files:
        f["sha256"], f["bytes"] = _sha256(out / f["path"]), (out / f["path"]).stat().st_size
    manifest = {
        "kind": "openforge.export", "format_version": FORMAT_VERSION, "export_id": export_id, "format": cfg.format,
        "store_id": store.store_id, "watermark": wm, "query": cfg.where, "config": cfg.to_json(),
        "counts": {"rollouts_seen": t.rollouts_seen, "unfinished": t.unfinished, "rollouts_exported": exported_rollouts,
                   "groups": t.groups, "singleton_groups": t.singleton_groups, "all_equal_groups": t.all_equal_groups,
                   "calls": t.calls, "merged_calls": t.merged, "rows": rows},
        "merge_rate": round(t.merged / t.calls, 6) if t.calls and planner.token_level else None,
        "exclusions": dict(sorted(t.exclusions.items())),
        "files": sorted(files, key=lambda f: f["path"]),
        "lineage": {k: sorted(v) for k, v in lineage.items()}, "software": _software(),
    }
    if correction is not None:
        manifest["rollout_correction"] = correction
    (out / MANIFEST).write_bytes(json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n")
    if record:
        store.record_export(export_id, format=cfg.format, watermark=wm, query=cfg.where, out_dir=str(out),
                            manifest=manifest, counts=manifest["counts"])
    return manifest


def _write_rows(planner: Planner, exporter, writers: dict[str, ShardWriter], lineage: dict[str, set],
                progress: Callable[[int, int], None] | None) -> tuple[dict[str, int], object, int]:
    """Every planned group's rows into ``writers``, their lineage into ``lineage``: (rows per file prefix, the
    latest ``ended_at`` of the exported rollouts, how many rollouts were exported)."""
    rows = {p: 0 for p in writers}
    done, data_time, exported_rollouts = 0, None, 0
    for plan in planner:
        for prefix, batch in exporter.rows(plan, planner).items():
            writers[prefix].add(batch)
            rows[prefix] += len(batch)
            note_lineage(batch, planner, lineage)
        data_time = latest(data_time, plan)
        exported_rollouts += len(plan.rollouts)
        done += len(plan.rollouts)
        if progress:
            progress(done, planner.total)
    return rows, data_time, exported_rollouts


def _openlineage(export_id: str, store_id: str, wm: int, cfg: ExportConfig, data_time, files: list[str]) -> dict:
    return {
        "eventType": "COMPLETE",
        "eventTime": data_time.isoformat() if data_time else "1970-01-01T00:00:00+00:00",
        "producer": "https://github.com/openforge/openforge/learner",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "run": {"runId": str(uuid.UUID(export_id)), "facets": {}},
        "job": {"namespace": "openforge", "name": f"export.{cfg.format}", "facets": {}},
        "inputs": [{"namespace": "openforge-store", "name": store_id,
                    "facets": {"openforge_watermark": {"watermark": wm, "query": cfg.where}}}],
        "outputs": [{"namespace": "openforge-export", "name": f"{export_id}/{f}"} for f in files],
    }


def _row_key(row: dict) -> str:
    if row.get("key") is not None:
        return str(row["key"])
    if "segment_index" in row:
        return f"{row.get('rollout_id')}#{row['segment_index']}"
    info = row.get("extra_info")
    if isinstance(info, dict) and info.get("group_id") is not None:
        return f"prompt of {info['group_id']}"
    return hashlib.sha256(repr(sorted(row.items())).encode()).hexdigest()[:16]


def _keyed_rows(paths: list[Path]) -> dict[str, tuple[str | None, dict[str, str]]]:
    """Row key -> (its group, column -> digest of the value) over shard files (one file's rows in memory at once)."""
    out = {}
    for path in paths:
        for row in pq.read_table(path).to_pylist():
            info = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
            out[_row_key(row)] = (row.get("group_id") or info.get("group_id"),
                                  {c: hashlib.sha256(repr(v).encode()).hexdigest() for c, v in row.items()})
    return out


def _groups(keys: list[str], rows: dict) -> str:
    groups = sorted({str(rows[k][0]) for k in keys if rows[k][0] is not None})
    if not groups:
        return ""
    more = f" and {len(groups) - 5} more" if len(groups) > 5 else ""
    return f" (group{'s' if len(groups) > 1 else ''} {', '.join(groups[:5])}{more})"


def rows_diff(derived: list[Path], on_disk: list[Path]) -> str:
    """What differs between the rows the store derives now and the rows of the files, matched by row key."""
    ours = _keyed_rows(derived)
    try:
        theirs = _keyed_rows(on_disk)
    except (pa.ArrowInvalid, OSError) as exc:
        return f"the files on disk cannot be read as Parquet ({exc})"
    missing = [k for k in ours if k not in theirs]
    extra = [k for k in theirs if k not in ours]
    changed = {}
    for k in ours.keys() & theirs.keys():
        cols = sorted(c for c in ours[k][1].keys() | theirs[k][1].keys() if ours[k][1].get(c) != theirs[k][1].get(c))
        if cols:
            changed[k] = cols
    if not (missing or extra or changed):
        return "same rows, different bytes"
    out = (f"{len(missing)} missing from the files{_groups(missing, ours)}, {len(extra)} extra in the files"
           f"{_groups(extra, theirs)}, {len(changed)} changed")
    if changed:
        cols = sorted({c for v in changed.values() for c in v})
        out += f": {', '.join(cols)} (first: {min(changed)})"
    return out


def _prefix(name: str) -> str:
    return name.rsplit("-", 1)[0] if name.endswith(".parquet") else name


def verify(manifest_path: Path | str, store: Store) -> dict:
    """Check the files against the manifest's hashes, then re-derive the export from the store and compare.

    Returns ``{"ok": bool, "problems": [str, ...]}``; each problem names the file and what differs.
    """
    manifest_path = Path(manifest_path)
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ExportError(f"{manifest_path}: manifest format_version {manifest.get('format_version')!r}; this "
                          f"openforge reads version {FORMAT_VERSION}. Verify with the version that wrote it.")
    if manifest["store_id"] != store.store_id:
        raise ExportError(f"{manifest_path}: exported from store {manifest['store_id']}, but --store is "
                          f"{store.store_id}; pass the store the export came from")
    folder, problems, on_disk = manifest_path.parent, [], {}
    for f in manifest["files"]:
        p = folder / f["path"]
        if not p.exists():
            problems.append(f"{f['path']}: missing")
            continue
        on_disk[f["path"]] = _sha256(p)
        if on_disk[f["path"]] != f["sha256"]:
            problems.append(f"{f['path']}: sha256 differs from the manifest (file changed on disk)")
    with tempfile.TemporaryDirectory() as tmp:
        again = export(store, Path(tmp) / "x", ExportConfig.from_json(manifest["config"]),
                       as_of=manifest["watermark"], record=False)
        ours = {f["path"]: f for f in again["files"]}
        differ: set[str] = set()  # shard sets (file prefixes) whose rows are compared by key below
        for f in manifest["files"]:
            g = ours.pop(f["path"], None)
            if g is None:
                problems.append(f"{f['path']}: the store no longer derives this file")
            elif g["sha256"] != f["sha256"] and not f["path"].endswith(".parquet"):
                problems.append(f"{f['path']}: re-derived from the store it differs: content differs")
            if f["path"].endswith(".parquet") and (g is None or on_disk.get(f["path"]) != g["sha256"]):
                differ.add(_prefix(f["path"]))  # the rows on disk are not the rows the store derives
        problems += [f"{p}: the store now derives a file the manifest lacks" for p in sorted(ours)]
        differ |= {_prefix(p) for p in ours if p.endswith(".parquet")}
        for prefix in sorted(differ):
            derived = [Path(tmp) / "x" / f["path"] for f in again["files"] if _prefix(f["path"]) == prefix]
            present = [folder / f["path"] for f in manifest["files"]
                       if _prefix(f["path"]) == prefix and (folder / f["path"]).exists()]
            problems.append(f"{prefix}-*.parquet: re-derived from the store, the rows differ: "
                            f"{rows_diff(derived, present)}")
        if again["exclusions"] != manifest["exclusions"]:
            problems.append(f"exclusions differ: manifest {manifest['exclusions']}, store {again['exclusions']}")
    if problems:
        problems = _erasures(store, manifest) + problems
    return {"ok": not problems, "problems": problems, "export_id": manifest["export_id"]}


def _erasures(store: Store, manifest: dict) -> list[str]:
    """The erasures that removed rollouts this export held (at its watermark), as the first problems to report."""
    held = erased_rollouts(store, as_of=manifest["watermark"])
    if not held:
        return []
    ids = {t for _, t in held.values()}
    named = [t.describe() for t in tombstones(store) if t.id in ids]
    n = len(held)
    return [f"this export held {n} rollout{'s' if n > 1 else ''} erased since by {'; '.join(named)}: an export "
            "that held erased rows can never verify again. Delete its shards (`openforge erase ... --shards`, or by "
            "hand) and export again: the new export records an `erased` exclusion for each of them"]
