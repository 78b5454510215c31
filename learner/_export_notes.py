"""What an export notes of each planned group besides its rows: the lineage the manifest lists and the data time
its OpenLineage event carries (the same in one process and in export workers)."""

from __future__ import annotations

from ._plan import GroupPlan, Planner


def note_lineage(batch: list[dict], planner: Planner, lineage: dict[str, set]) -> None:
    """What the manifest's lineage lists of these rows, into ``lineage`` (key -> values)."""
    for row in batch:
        for key, col in (("image_digests", "image_digest"), ("policy_versions", "policy_version_id"),
                         ("verifier_versions", "verifier_version"), ("reward_sources", "reward_source")):
            if row.get(col) is not None:
                lineage.setdefault(key, set()).add(row[col])
        if row.get("tool_schema_hashes"):
            lineage.setdefault("tool_schema_hashes", set()).update(row["tool_schema_hashes"])
        if row.get("harness_id"):
            h = planner.harnesses.get(row["harness_id"], {})
            lineage.setdefault("harnesses", set()).add(f"{h.get('name', row['harness_id'])}@{h.get('version')}")


def latest(data_time, plan: GroupPlan):
    """The later of ``data_time`` and the latest ``ended_at`` of the plan's rollouts (None when neither has one)."""
    for rp in plan.rollouts:
        if rp.info.ended_at is not None and (data_time is None or rp.info.ended_at > data_time):
            data_time = rp.info.ended_at
    return data_time
