"""The learner: token-exact reconstruction, GRPO groups and advantages, reproducible training exports,
behaviour analysis, the CPU train step (GRPO or SFT) and the lineage of the policy versions it trains.

Everything another part (or the ``openforge`` roof) may use is here; the modules behind it are private.
"""

from ._analysis import SLICES, AnalysisError, analyze, rubric_summary
from ._analysis_config import RubricConfig, RubricConfigError
from ._compare import Difference, TaskAgg, compare_tasks, compare_versions, mcnemar_exact, version_tasks
from ._export import ExportError, export, verify
from ._formats import EXPORTERS, Exporter, get_exporter
from ._grpo import GrpoConfig, group_advantages, grpo_advantages, policy_lag, policy_order
from ._lineage import LineageError, policy_lineage
from ._mismatch import WHY_SELF_FAILS, self_consistency
from ._mismatch import by_version as mismatch_by_version
from ._mismatch import pairs as mismatch_pairs
from ._mismatch import per_rollout as mismatch_per_rollout
from ._mismatch import tally as mismatch_tally
from ._plan import ExportConfig
from ._query import QueryError, parse_where
from ._rescore import RescoreError, RescoreResult, rescore
from ._reconstruct import Reconstruction, Segment, reconstruct, reconstruct_rollout, reconstruct_tokens
from ._report import comparison_rows, print_comparison, print_table
from ._export_location import export_to, verify_at
from ._rubrics import RolloutRubrics, ToolStep, rollout_rubrics, tool_steps
from ._stats import pass_at_k, pass_hat_k, wilson_interval
from ._train import TrainError, TrainResult, train

__all__ = ["AnalysisError", "Difference", "EXPORTERS", "ExportConfig", "ExportError", "Exporter", "GrpoConfig",
           "LineageError", "QueryError", "Reconstruction", "RescoreError", "RescoreResult", "RolloutRubrics",
           "RubricConfig", "RubricConfigError", "SLICES", "Segment", "TaskAgg", "ToolStep", "TrainError", "TrainResult",
           "WHY_SELF_FAILS", "analyze", "compare_tasks", "compare_versions", "comparison_rows", "export", "export_to",
           "get_exporter", "group_advantages", "grpo_advantages", "mcnemar_exact", "mismatch_by_version",
           "mismatch_pairs", "mismatch_per_rollout", "mismatch_tally", "parse_where", "pass_at_k", "pass_hat_k",
           "policy_lag", "policy_lineage", "policy_order", "print_comparison", "print_table", "reconstruct",
           "reconstruct_rollout", "reconstruct_tokens", "rescore", "rollout_rubrics", "rubric_summary",
           "self_consistency", "tool_steps",
           "train", "verify", "verify_at", "version_tasks", "wilson_interval"]
