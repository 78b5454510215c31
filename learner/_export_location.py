"""Where an export's shards live, and reading their rows back for training in the shape a trainer takes them.

``export_to`` / ``verify_at`` take a folder or an ``s3://bucket/prefix`` URL (issue 23). For a URL the export is
written to a local staging folder exactly as for a folder (so its bytes, hashes and manifest are the same), each
file is uploaded (an atomic put), and ``manifest.json`` is uploaded LAST: a manifest at the URL proves every shard
it lists is there. ``verify_at`` downloads what the manifest lists and runs the same ``verify``, which re-derives
the export from the store.

SFT rows come back as Hugging Face ``datasets`` decodes them for TRL: tool-call arguments and tool schemas (Arrow's
JSON type, JSON text to pyarrow) parsed into objects, so the chat template renders what the engine rendered.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

from forge_store import ObjectNotFound, Store, is_url, open_location

from ._export import MANIFEST, export, verify
from ._plan import ExportConfig, ExportError

ROWS = {  # export format -> (file prefix, columns a trainer reads)
    "verl": ("trajectories", ["prompt_ids", "response_ids", "response_mask", "response_logprobs", "advantage",
                              "policy_version_id"]),
    "sft": ("conversations", ["messages", "tools", "policy_version_id", "purpose"]),
}


def _decode_conversation(row: dict) -> dict:
    for m in row["messages"]:
        for tc in m.get("tool_calls") or ():
            tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
    row["tools"] = [json.loads(t) for t in row["tools"]] if row.get("tools") else None
    return row


def read_rows(shard: Path, manifest: dict) -> list[dict]:
    """Every row of the shard's training files, in file order (the manifest lists them sorted)."""
    prefix, columns = ROWS[manifest["format"]]
    if manifest.get("rollout_correction"):   # a veRL shard with off-policy weights (learner._rollout_correction)
        columns = [*columns, manifest["rollout_correction"]["column"]]
    rows: list[dict] = []
    for f in manifest["files"]:
        if f["path"].startswith(prefix + "-") and f["path"].endswith(".parquet"):
            rows.extend(pq.read_table(shard / f["path"], columns=columns).to_pylist())
    if manifest["format"] == "sft":
        rows = [_decode_conversation(r) for r in rows]
    return rows


class _RecordedAt:
    """The store, except that the export's row names where its shards live (the URL), not the staging folder."""

    def __init__(self, store: Store, url: str):
        self._store, self._url = store, url

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def record_export(self, export_id: str, **kw) -> None:
        self._store.record_export(export_id, **{**kw, "out_dir": self._url})


def export_to(store: Store, out: str | Path, cfg: ExportConfig, *, as_of: int | None = None, record: bool = True,
              progress: Callable[[int, int], None] | None = None,
              uploaded: Callable[[str], None] | None = None, workers: int | None = None) -> dict:
    """``export`` into a new folder or a new ``s3://`` prefix; ``uploaded(name)`` after each object put."""
    if not is_url(out):
        return export(store, out, cfg, as_of=as_of, record=record, progress=progress, workers=workers)
    dest = open_location(str(out), store.settings)
    if dest.list():
        raise ExportError(f"--out {out}: objects already exist under this prefix; an export owns its prefix. Pick a "
                          "new one or remove these.")
    with tempfile.TemporaryDirectory(prefix="openforge-export-") as tmp:
        staged = Path(tmp) / "export"
        manifest = export(_RecordedAt(store, dest.url), staged, cfg, as_of=as_of, record=record, progress=progress,
                          workers=workers)
        for name in [*(f["path"] for f in manifest["files"]), MANIFEST]:
            dest.put_file(name, staged / name)
            if uploaded:
                uploaded(name)
    return manifest


def verify_at(manifest: str | Path, store: Store) -> dict:
    """``verify`` for a manifest in a folder or at an ``s3://`` URL (its shards are downloaded first)."""
    if not is_url(manifest):
        return verify(manifest, store)
    prefix, _, name = str(manifest).rpartition("/")
    src = open_location(prefix, store.settings)
    with tempfile.TemporaryDirectory(prefix="openforge-verify-") as tmp:
        local = Path(tmp)
        try:
            src.get_file(name, local / MANIFEST)
        except ObjectNotFound:
            raise ExportError(f"{manifest}: no manifest there (an export that did not finish has none); pass the "
                              "manifest.json of a finished export") from None
        for f in json.loads((local / MANIFEST).read_text())["files"]:
            try:
                src.get_file(f["path"], local / f["path"])
            except ObjectNotFound:
                pass  # verify reports it missing
        return verify(local / MANIFEST, store)
