"""Reading an export's rows back for training, in the shape a trainer takes them.

SFT rows come back as Hugging Face ``datasets`` decodes them for TRL: tool-call arguments and tool schemas (Arrow's
JSON type, JSON text to pyarrow) parsed into objects, so the chat template renders what the engine rendered.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

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
    rows: list[dict] = []
    for f in manifest["files"]:
        if f["path"].startswith(prefix + "-") and f["path"].endswith(".parquet"):
            rows.extend(pq.read_table(shard / f["path"], columns=columns).to_pylist())
    if manifest["format"] == "sft":
        rows = [_decode_conversation(r) for r in rows]
    return rows
