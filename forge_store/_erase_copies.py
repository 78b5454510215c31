"""The copies an erasure cleans besides the database: journals and their dead letters, the blob store, Parquet
snapshots and lake partitions (a folder or ``s3://``), and the exported shards that held erased rows.

Every step is idempotent and each file is replaced atomically (a temporary file renamed over it, or one S3 put), so
an erasure killed in the middle of one leaves every file whole and a rerun does what is left.

Journal records are blanked in place *with the same length*: the record becomes ``{"k": "erased", "pad": ...}``
(or, for a record that also carries kept bodies, the record without the erased ones, padded), so the journal's
checkpoint positions stay valid; the writer skips an ``erased`` record. A journal that a running writer holds is
only read: if it still holds an erased record, the step fails naming it (stop that writer, let it drain, rerun).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import msgpack
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ._errors import StoreError
from ._hashing import sha256_hex
from ._objstore import Location, ObjectNotFound, open_location
from ._write.journal_files import (
    HEADER, FrameDamage, JournalLocked, frame_payloads, lock_directory, read_frames, segment_numbers, segment_path,
)
from ._write.op_codec import unpack_op


class EraseError(StoreError):
    """A copy could not be cleaned (a journal in use, an unreachable object store); a rerun finishes the erasure."""


class Keys:
    """The keys an erasure removes (``items``: kind -> set) and the pattern's stored forms, if any."""

    def __init__(self, items: dict[str, set[str]], forms: list[str] | None = None):
        self.items = items
        self.forms = [f.encode() for f in forms or ()]

    def __getitem__(self, kind: str) -> set[str]:
        return self.items.get(kind, set())

    # ---- journal operations ---------------------------------------------------------------------------------
    def clean_op(self, op: dict) -> dict | None:
        """``op`` without what is erased (None: nothing of it stays); ``op`` itself when it holds nothing erased."""
        k, r = op.get("k"), op.get("r") or {}
        if k == "erased":
            return op
        if (k == "call" and (r.get("id") in self["call"] or r.get("rollout_id") in self["rollout"])) \
                or (k in ("rollout_start", "rollout_finish") and r.get("id") in self["rollout"]) \
                or (k in ("reward", "event", "exclusion") and (r.get("rollout_id") in self["rollout"]
                                                              or r.get("call_id") in self["call"])) \
                or (k == "blob" and r.get("sha256") in self["blob"]) \
                or (k == "task" and r.get("id") in self["task"]) \
                or (k == "task_version" and r.get("task_id") in self["task"]):
            return None
        if k in ("msgs", "call"):
            msgs = op.get("msgs") or {}
            kept = {h: v for h, v in msgs.items() if h not in self["message"]}
            tools = op.get("tools")
            drop_tools = bool(tools) and tools[0] in self["tool_schema"]
            if len(kept) != len(msgs) or drop_tools:
                op = {**op, "msgs": kept}
                if drop_tools:
                    op.pop("tools")
                if k == "msgs" and not kept and not op.get("tools"):
                    return None
        return op

    def dirty(self, payload: bytes) -> bool:
        return any(f in payload for f in self.forms)


def _same_length(op: dict | None, length: int) -> bytes:
    """``op`` (None: the ``erased`` marker) packed with padding to exactly ``length`` bytes."""
    base = {"k": "erased"} if op is None else op
    for candidate in (base, {"k": "erased"}):
        first = len(msgpack.packb({**candidate, "pad": b""}, datetime=True, use_bin_type=True))
        for n in range(max(0, length - first - 4), length - first + 1):
            out = msgpack.packb({**candidate, "pad": b"\0" * n}, datetime=True, use_bin_type=True)
            if len(out) == length:
                return out
    raise EraseError(f"a journal record of {length} bytes is too short to blank in place; move the journal aside "
                     "after draining it (`openforge store drain`), then rerun the erasure")


def journal_dirs(home: Path, journal_dir: Path | None) -> list[Path]:
    dirs = [journal_dir] if journal_dir is not None else []
    root = home / "journal"
    if root.is_dir():
        dirs += sorted(p for p in root.iterdir() if p.is_dir())
    return [d for d in dirs if d.is_dir()]


def clean_journal(directory: Path, keys: Keys) -> dict:
    """Blank erased records in every segment and delete erased dead letters; counts of what was removed."""
    counts = {"journal_records": 0, "dead_letters": 0}
    dead = directory / "dead-letter"
    for path in sorted(dead.glob("*.msgpack")) if dead.is_dir() else ():
        data = path.read_bytes()
        try:
            op = unpack_op(data)
        except (ValueError, msgpack.ExtraData):
            op = {}
        if keys.dirty(data) or keys.clean_op(op) is not op:
            path.unlink()
            counts["dead_letters"] += 1
    try:
        fd = lock_directory(directory) if (directory / "LOCK").exists() or segment_numbers(directory) else None
    except JournalLocked as exc:
        n = sum(1 for _ in _erased_records(directory, keys))
        if n:
            raise EraseError(f"journal {directory} holds {n} erased records and is in use by a running writer "
                             f"({exc}); stop that writer (it drains on its next start, or run `openforge store "
                             "drain`), then rerun the erasure to finish it") from None
        return counts
    try:
        for seg in segment_numbers(directory):
            counts["journal_records"] += _rewrite_segment(segment_path(directory, seg), keys)
    finally:
        if fd is not None:
            os.close(fd)
    return counts


def _records(path: Path):
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        try:
            yield from read_frames(f, 0, size)
        except FrameDamage:
            return  # a torn tail: its owner cuts it off on open; it was never acknowledged


def _erased_records(directory: Path, keys: Keys):
    for seg in segment_numbers(directory):
        for _, payload in _records(segment_path(directory, seg)):
            if keys.dirty(payload) or keys.clean_op(unpack_op(payload)) is not unpack_op(payload):
                yield payload


def _rewrite_segment(path: Path, keys: Keys) -> int:
    payloads, changed = [], 0
    for _, payload in _records(path):
        op = unpack_op(payload)
        cleaned = keys.clean_op(op)
        if cleaned is op and not keys.dirty(payload):
            payloads.append(payload)
            continue
        new = _same_length(cleaned, len(payload))
        if keys.dirty(new):
            new = _same_length(None, len(payload))
        payloads.append(new)
        changed += op.get("k") != "erased"
    if not changed:
        return 0
    tmp = path.with_name(path.name + ".erase-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for frame in frame_payloads(payloads):
            os.write(fd, frame)
        os.fsync(fd)
    finally:
        os.close(fd)
    assert tmp.stat().st_size == sum(HEADER.size + len(p) for p in payloads)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return changed


# ---- Parquet copies -------------------------------------------------------------------------------------------
def _row_filter(table: str, keys: Keys) -> list[tuple[str, set[str]]]:
    """(column, keys) pairs: a row of ``table`` whose column holds one of the keys is erased."""
    return {
        "rollouts": [("id", keys["rollout"])], "calls": [("id", keys["call"]), ("rollout_id", keys["rollout"])],
        "messages": [("sha256", keys["message"])], "tool_schemas": [("sha256", keys["tool_schema"])],
        "blobs": [("sha256", keys["blob"])], "rewards": [("rollout_id", keys["rollout"])],
        "events": [("rollout_id", keys["rollout"])],
        "exclusions": [("rollout_id", keys["rollout"]), ("call_id", keys["call"])],
        "rescores": [("call_id", keys["call"]), ("rollout_id", keys["rollout"])],
        "call_search": [("call_id", keys["call"]), ("rollout_id", keys["rollout"])],
        "tasks": [("id", keys["task"])], "task_versions": [("task_id", keys["task"])],
    }.get(table, [])


def _filter_file(loc: Location, rel: str, table: str, keys: Keys, tmp: Path) -> tuple[int, str] | None:
    """Rewrite one Parquet file without erased rows: (rows left, its sha256), or None if it is absent."""
    local = tmp / "in.parquet"
    try:
        loc.get_file(rel, local)
    except ObjectNotFound:
        return None
    data = pq.read_table(local)
    keep = None
    for col, wanted in _row_filter(table, keys):
        if wanted and col in data.column_names:
            hit = pc.fill_null(pc.is_in(data[col], value_set=_array(wanted)), False)
            keep = pc.invert(hit) if keep is None else pc.and_(keep, pc.invert(hit))
    if keep is not None and not pc.all(keep).as_py():
        data = data.filter(keep)
        out = tmp / "out.parquet"
        pq.write_table(data, out, compression="zstd", write_statistics=True)
        loc.put_file(rel, out)
        local = out
    return data.num_rows, sha256_hex(local.read_bytes())


def _array(values: set[str]):
    import pyarrow as pa

    return pa.array(sorted(values), type=pa.string())


def clean_snapshot(url: str, keys: Keys, tombstone_id: str, settings) -> dict | None:
    """Rewrite a snapshot's tables without erased rows, then its manifest (last). None: no snapshot there."""
    loc = open_location(url, settings)
    try:
        manifest = json.loads(loc.get_bytes("manifest.json"))
    except ObjectNotFound:
        return None
    removed, changed = 0, False
    with tempfile.TemporaryDirectory(prefix="openforge-erase-") as tmp:
        for table, info in manifest["tables"].items():
            if not _row_filter(table, keys):
                continue
            got = _filter_file(loc, info["file"], table, keys, Path(tmp))
            if got is not None and got != (info["rows"], info["sha256"]):   # rewritten now, or by a killed run
                removed += info["rows"] - got[0]
                info["rows"], info["sha256"] = got
                changed = True
    if changed:   # a snapshot that held none of it is left as it was
        manifest.setdefault("erasures", []).append(tombstone_id)
        loc.put_bytes("manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n")
    return {"rows": removed}


def clean_lake(url: str, keys: Keys, tombstone_id: str, settings) -> dict | None:
    """Rewrite every partition of a lake without erased rows, and each snapshot's manifest after its files."""
    from ._lake import MANIFESTS, lake_manifests, wm_key

    loc = open_location(url, settings)
    manifests = lake_manifests(loc)
    if not manifests:
        return None
    removed = partitions = 0
    with tempfile.TemporaryDirectory(prefix="openforge-erase-") as tmp:
        for m in manifests:
            changed = False
            for table, info in m["tables"].items():
                if not _row_filter(table, keys) or not info["rows"]:
                    continue
                got = _filter_file(loc, info["path"], table, keys, Path(tmp))
                if got is not None and got != (info["rows"], info["sha256"]):
                    removed += info["rows"] - got[0]
                    partitions += 1
                    info["rows"], info["sha256"] = got
                    changed = True
            if changed:
                m.setdefault("erasures", []).append(tombstone_id)
                loc.put_bytes(f"{MANIFESTS}/{wm_key(m['to_watermark'])}.json",
                              json.dumps(m, indent=2, sort_keys=True).encode() + b"\n")
    return {"rows": removed, "partitions": partitions}


def delete_shards(out_dir: str, settings) -> int:
    """Delete an export's files, its manifest last (so a rerun still finds what is left); how many were there."""
    loc = open_location(out_dir, settings)
    try:
        manifest = json.loads(loc.get_bytes("manifest.json"))
    except ObjectNotFound:
        return 0
    n = 0
    for f in manifest.get("files", []):
        if loc.exists(f["path"]):
            loc.delete(f["path"])
            n += 1
    loc.delete("manifest.json")
    return n + 1
