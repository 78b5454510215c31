"""The house rules that a machine can check: layering contracts, pinned public surfaces, module sizes, the root command.

A change that fails here is a design change: update ../shared/DESIGN.md-level docs (docs/architecture.md), the
contracts in .importlinter or the pinned lists below in the same commit, on purpose.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("openforge", "forge_store", "proxy", "rollout", "learner", "dashboards", "migrations")
# Modules allowed past ~400 lines, with the reason (none today: the last six were split in the restructure).
LONG_MODULES: dict[str, str] = {}

PUBLIC = {
    # The store's API: a proxy records a call through a CallDraft (begin_call, start, finish); the encoder's types
    # (PendingPrompt, PromptPart) stay private, as its journal and writers do (issue 31).
    "forge_store": ["ANALYSIS_VIEWS", "Backoff", "BlobCorrupt", "BlobNotFound", "BlobStore", "CallDraft", "CallRecord",
                    "CallSummary", "EXCLUSION_REASONS", "EventInfo", "FINISH_REASON_MAX", "IdsText", "InvalidRecord",
                    "JournalCorrupt", "JournalError", "JournalLocked", "LocalBlobStore", "Location", "NotFound",
                    "OUTCOMES", "ObjectBlobStore", "ObjectNotFound", "ObjectStoreError", "REWARD_SOURCES",
                    "RescoreRow", "RewardInfo", "RolloutFilter", "RolloutInfo", "SchemaMismatch", "SearchHit", "Settings", "Stats", "Store",
                    "StoreError", "StoreURLError", "StoreUnavailable", "StoredCall", "TimelineCall", "TokenCall", "Trajectory",
                    "Window", "canonical_json", "connect_duckdb", "get_settings", "is_url", "json_sha256",
                    "latest_reward", "open_blob_store", "open_location", "open_store", "print_table", "record_rescores", "rescored_call_ids",
                    "rescores", "sha256_hex",
                    # erasure (issue 35): the machinery, its selection and report, the tombstones exports consult
                    "EraseError", "ErasureReport", "Selection", "TombstoneInfo", "erase", "erased_rollouts",
                    "resume_erasures", "tombstones"],
    "proxy": ["HttpLimits", "HttpServer", "Proxy", "ProxyError", "ProxySettings", "UpstreamFailure", "build_proxy"],
    "proxy.engines": ["CACHE_ENV", "CheckpointError", "DEFAULT_MAX_TOKENS", "MODEL_NAME", "VllmServer", "chat_template",
                      "default_cache_dir", "ensure_env", "ensure_model"],
    "proxy.engines.scripted": ["ChatTokenizer", "Conversations", "Delay", "HTTPError", "RecordedRequest",
                      "Script", "ScriptedUpstream", "Step", "Text", "ToolCall", "ToolCalls", "UpstreamServer",
                      "load_script", "load_smollm2_tokenizer", "load_tokenizer_from_gguf", "run_upstream",
                      "steps_from_actions"],
    "rollout": ["AdminClient", "HarnessAdapter", "HarnessNotInstalled", "KubernetesConfig", "Mount", "Orchestrator",
                "Phase", "PhaseResult", "ProxyUnavailable", "Resources", "RunConfig", "RunSummary", "Sandbox",
                "SandboxBackend", "SandboxError", "SandboxSpec", "SocketRelay", "Task", "TaskError", "TaskGenError",
                "TaskVersion", "Validation", "backend_names", "claim_socket", "diff_versions", "generate_tasks", "get_backend",
                "get_harness", "harness_names", "load_task", "load_tasks", "served_models", "task_families",
                "task_version", "tasks_app", "validate_task"],
    "learner": ["RescoreError", "TaskAgg", "RescoreResult", "WHY_SELF_FAILS", "mismatch_by_version", "mismatch_pairs",
                "mismatch_per_rollout", "mismatch_tally", "rescore", "self_consistency",
                "AnalysisError", "Difference", "EXPORTERS", "ExportConfig", "ExportError", "Exporter", "GrpoConfig",
                "LineageError", "QueryError", "Reconstruction", "RolloutRubrics", "RubricConfig", "RubricConfigError",
                "SLICES", "Segment", "ToolStep", "TrainError", "TrainResult", "analyze", "compare_tasks",
                "compare_versions", "comparison_rows", "export", "export_to", "get_exporter", "group_advantages",
                "grpo_advantages", "mcnemar_exact", "parse_where", "pass_at_k", "pass_hat_k", "policy_lag",
                "policy_lineage", "policy_order", "print_comparison", "print_table", "reconstruct",
                "reconstruct_rollout", "reconstruct_tokens", "rollout_rubrics", "rubric_summary", "tool_steps", "train",
                "verify",
                "verify_at", "version_tasks", "wilson_interval"],
    "forge_store.testing": ["REACT_TOOLS", "T0", "Turn", "agent_calls", "png_1px", "seed_demo_store"],
}


def test_import_contracts_hold():
    """The layering in .importlinter (the store imports no part; peers meet only through public names; no cycles)."""
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--config", str(ROOT / ".importlinter")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_surface_is_pinned(module):
    """What other parts may import from ``module``; a change here is an API change."""
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(PUBLIC[module])
    for name in mod.__all__:
        assert getattr(mod, name) is not None, name


def test_modules_stay_small():
    """A module owns one concept; past ~400 lines it usually owns two (LONG_MODULES says why when it does not)."""
    long = {}
    for part in PARTS:
        for path in (ROOT / part).rglob("*.py"):
            rel = str(path.relative_to(ROOT))
            n = len(path.read_text().splitlines())
            if n > 400 and rel not in LONG_MODULES and "/versions/" not in rel:
                long[rel] = n
    assert not long, f"modules over 400 lines (split them, or say why in LONG_MODULES): {long}"


def test_every_declared_command_loads():
    """Each part's commands come from entry points: every one names an object the root can register."""
    eps = md.entry_points(group="openforge.commands")
    assert {"db", "store", "sql", "proxy", "export", "analyze", "dashboard", "run", "demo", "train"} <= {e.name for e in eps}
    for ep in eps:
        obj = ep.load()
        assert isinstance(obj, typer.Typer) or callable(obj), ep


def test_a_command_whose_extra_is_missing_says_which_extra(monkeypatch):
    """A part installed without its extra has no working commands, and the message names the extra to install."""
    from openforge import cli

    real = md.entry_points

    def entry_points(group=None, **kw):
        if group == cli.GROUP:
            return [md.EntryPoint(name="launch", value="no_such_part._cli:command [k8s]", group=cli.GROUP)]
        return real(group=group, **kw)

    monkeypatch.setattr(cli.md, "entry_points", entry_points)
    monkeypatch.setattr(cli, "_installed", lambda: frozenset())  # nothing of the k8s extra is installed
    app = cli.build_app()
    res = CliRunner().invoke(app, ["launch", "--anything"])
    assert res.exit_code == 2
    assert "pip install 'openforge[k8s]'" in res.output and "kubernetes" in res.output


def test_a_broken_part_does_not_take_the_others_down(monkeypatch):
    from openforge import cli

    real = md.entry_points

    def entry_points(group=None, **kw):
        if group == cli.GROUP:
            return [*real(group=group), md.EntryPoint(name="broken", value="no_such_module:x", group=cli.GROUP)]
        return real(group=group, **kw)

    monkeypatch.setattr(cli.md, "entry_points", entry_points)
    app = cli.build_app()
    runner = CliRunner()
    assert runner.invoke(app, ["store", "--help"]).exit_code == 0
    res = runner.invoke(app, ["broken"])
    assert res.exit_code == 2 and "no_such_module" in res.output


def test_no_part_imports_the_roof():
    """``openforge`` sits above the parts; a part that imported it would turn the roof into a floor."""
    for part in PARTS[1:]:
        for path in (ROOT / part).rglob("*.py"):
            text = path.read_text()
            assert "from openforge" not in text and "import openforge" not in text, path


def test_every_setting_is_documented_in_one_place():
    """One environment scheme for every part's settings, listed in docs/configuration.md (each part owns its own
    settings class: the store's ``Settings``, the proxy's ``ProxySettings``)."""
    from forge_store import Settings
    from proxy import ProxySettings

    doc = (ROOT / "docs" / "configuration.md").read_text()
    missing = []
    for cls in (Settings, ProxySettings):
        for name, info in cls.model_fields.items():
            names = [a for a in getattr(info.validation_alias, "choices", ()) or () if isinstance(a, str)]
            for env in names or [cls.model_config["env_prefix"] + name.upper()]:
                if f"`{env}`" not in doc:
                    missing.append(env)
    assert not missing, f"settings not in docs/configuration.md: {missing}"
    assert not any(n.startswith("proxy_") for n in Settings.model_fields), "the proxy's settings are ProxySettings'"
