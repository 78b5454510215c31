"""A policy version's lineage: the chain base -> SFT -> GRPO rounds, read from the store.

Each trained version's metadata names its parent and the shard it was trained on (``learner.train`` writes it);
the export's row in the store gives the shard's folder and watermark where older metadata lacks them. The chain
ends at a version with no parent (the base), or at a parent the store does not hold (marked ``missing``).
"""

from __future__ import annotations

from forge_store import Store


class LineageError(LookupError):
    """An unknown policy version (the message lists the known ones) or a cycle in the parents."""


def _link(row: dict, exports: dict[str, dict]) -> dict:
    meta = row.get("metadata") or {}
    exp = exports.get(meta.get("export_id") or "", {})
    algorithm = meta.get("algorithm") or ("base" if not meta.get("parent") else None)
    if algorithm and algorithm.startswith("grpo"):   # versions trained before the algorithm had a short name
        algorithm = "grpo"
    return {
        "policy_version": row["id"], "algorithm": algorithm, "parent": meta.get("parent"),
        "global_step": row.get("global_step"), "checkpoint": row.get("checkpoint_id"),
        "created_at": row["created_at"].isoformat() if row.get("created_at") else None,
        "export_id": meta.get("export_id"), "shard": meta.get("shard") or exp.get("out_dir"),
        "watermark": meta.get("watermark", exp.get("watermark")),
        "samples": meta.get("sample_count", meta.get("samples")), "steps": meta.get("steps"),
        "loss_first": meta.get("loss_first"), "loss_last": meta.get("loss_last", meta.get("loss")),
        "importance_ratio_mean": meta.get("importance_ratio_mean", meta.get("mean_ratio")),
        "importance_k3": meta.get("importance_k3"),
    }


def policy_lineage(store: Store, version: str) -> list[dict]:
    """The chain that led to ``version``, root (base) first: one dict per policy version (see ``_link``)."""
    rows = {r["id"]: r for r in store.lineage("policy_versions")}
    if version not in rows:
        known = list(rows)
        shown = ", ".join(known[-20:]) + (f" (and {len(known) - 20} older)" if len(known) > 20 else "")
        raise LineageError(f"policy version {version!r} is not in the store; known: {shown or '(none)'}")
    exports = {e["id"]: e for e in store.lineage("exports")}
    chain: list[dict] = []
    current: str | None = version
    while current is not None:
        if any(link["policy_version"] == current for link in chain):
            raise LineageError(f"policy version {current!r} is its own ancestor (parents: "
                               f"{' <- '.join(link['policy_version'] for link in chain)}); fix the parent metadata")
        if current not in rows:
            chain.append({"policy_version": current, "missing": True})
            break
        chain.append(_link(rows[current], exports))
        current = chain[-1]["parent"]
    return chain[::-1]
