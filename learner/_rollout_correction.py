"""A veRL exporter whose trajectory rows carry ``rollout_is_weights`` (see :mod:`learner._rollout_weights`).

The trainer's logprobs are the stored re-scores (``openforge rescore``) of each row's calls under the version the
trainer starts from, read as of the export's watermark (so ``verify`` re-derives the same weights); the engine's are
the row's ``response_logprobs``. A row's policy tokens are its calls' completion tokens in call order, so the
re-scores of ``call_ids`` laid over the mask's 1s give the trainer's logprob of every policy token. A call of the
export without a re-score is an error that says which command stores them; a row without engine logprobs gets no
weights (null: the trainer takes it as on-policy).
"""

from __future__ import annotations

import pyarrow as pa

from forge_store import rescores

from ._export_config import ExportConfig, ExportError
from ._rollout_weights import check, rollout_is_weights, verl_settings

COLUMN = pa.field("rollout_is_weights", pa.list_(pa.float32()))


def _list(v) -> list | None:
    return None if v is None else v.tolist() if hasattr(v, "tolist") else list(v)


class RolloutCorrected:
    """``inner`` (the veRL exporter) with the weights column on its trajectory rows."""

    def __init__(self, inner, cfg: ExportConfig, version: str):
        if inner.name != "verl":
            raise ExportError(f"--rollout-is with --format {inner.name}: importance weights ride in veRL shards "
                              "only; pass --format verl")
        try:
            check(cfg.rollout_is, cfg.rollout_is_cap)
        except ValueError as exc:
            raise ExportError(str(exc)) from None
        self.inner, self.cfg, self.version = inner, cfg, version
        self.name = inner.name
        self.schemas = {**inner.schemas, "trajectories": inner.schemas["trajectories"].append(COLUMN)}
        self.running_index = inner.running_index

    @property
    def n_prompts(self) -> int:
        return self.inner.n_prompts

    @n_prompts.setter
    def n_prompts(self, value: int) -> None:
        self.inner.n_prompts = value

    def rows(self, plan, planner) -> dict[str, list[dict]]:
        out = self.inner.rows(plan, planner)
        traj = out.get("trajectories") or []
        wanted = [c for r in traj for c in r["call_ids"]]
        scored = {r.call_id: r.logprobs for r in rescores(planner.store, policy_version_id=self.version,
                                                          scorer=self.cfg.rollout_is_scorer, call_ids=wanted,
                                                          as_of=planner.wm)}
        missing = [c for c in wanted if c not in scored]
        if missing:
            raise ExportError(
                f"{len(missing)} calls of group {plan.key} (e.g. {missing[0]}) have no re-score under "
                f"{self.version} by {self.cfg.rollout_is_scorer} as of watermark {planner.wm}, so their importance "
                f"weights cannot be computed: run `openforge rescore --version {self.version} --scorer "
                f"{self.cfg.rollout_is_scorer}` with the export's --where first, then export again")
        for r in traj:
            engine, mask = _list(r["response_logprobs"]), _list(r["response_mask"])
            if engine is None:
                r["rollout_is_weights"] = None
                continue
            flat = [x for c in r["call_ids"] for x in scored[c]]
            if sum(mask) != len(flat):
                raise ExportError(f"row {r['key']}: {sum(mask)} policy tokens but {len(flat)} re-scored ones for its "
                                  "calls; the re-scores do not belong to these calls' completions")
            old = iter(flat)
            trainer = [next(old) if m else 0.0 for m in mask]
            r["rollout_is_weights"] = rollout_is_weights(trainer, engine, mask, self.cfg.rollout_is,
                                                         self.cfg.rollout_is_cap)
        return out


def manifest_entry(cfg: ExportConfig, version: str) -> dict:
    """What the manifest says of the weights: our mode and cap, and the veRL rollout-correction settings that
    compute the same weights."""
    return {"column": COLUMN.name, "mode": cfg.rollout_is, "cap": cfg.rollout_is_cap, "version": version,
            "scorer": cfg.rollout_is_scorer, "verl": verl_settings(cfg.rollout_is, cfg.rollout_is_cap)}
