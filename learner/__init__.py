"""The learner: token-exact reconstruction, GRPO groups and advantages, reproducible training exports."""

from .export import ExportError, export, verify
from .formats import EXPORTERS, Exporter, get_exporter
from .grpo import GrpoConfig, group_advantages, grpo_advantages
from .plan import ExportConfig
from .query import QueryError, parse_where
from .reconstruct import Reconstruction, Segment, reconstruct, reconstruct_rollout

__all__ = ["EXPORTERS", "ExportConfig", "ExportError", "Exporter", "GrpoConfig", "QueryError", "Reconstruction",
           "Segment", "export", "get_exporter", "group_advantages", "grpo_advantages", "parse_where", "reconstruct",
           "reconstruct_rollout", "verify"]
