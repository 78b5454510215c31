"""Harness adapters, registered by short name. ``get_harness("nope")`` fails with the list of known names."""

from __future__ import annotations

from pathlib import Path

from .base import HarnessAdapter, HarnessExit, HarnessNotInstalled, Launch, LaunchContext

_REGISTRY = {
    "react": ("rollout._harnesses.react", "ReactHarness"),
    "oracle": ("rollout._harnesses.oracle", "OracleHarness"),
    "mini-swe-agent": ("rollout._harnesses.mini_swe_agent", "MiniSweAgentHarness"),
    "codex": ("rollout._harnesses.codex", "CodexHarness"),
    "claude-code": ("rollout._harnesses.claude_code", "ClaudeCodeHarness"),
    "gemini-cli": ("rollout._harnesses.gemini_cli", "GeminiCliHarness"),
    "openclaw": ("rollout._harnesses.openclaw", "OpenClawHarness"),
    "computer-use": ("rollout._harnesses.computer_use", "ComputerUseHarness"),
    "browser-use": ("rollout._harnesses.computer_use_browser_use", "BrowserUseHarness"),
}


def harness_names() -> list[str]:
    return list(_REGISTRY)


def get_harness(name: str, *, cache_dir: Path | None = None, **options) -> HarnessAdapter:
    """The adapter registered as ``name``; ``cache_dir`` is where installs that sandboxes see live."""
    if name not in _REGISTRY:
        raise KeyError(f"harness {name!r} is unknown: the known harnesses are {', '.join(_REGISTRY)}")
    import importlib

    from forge_store import get_settings

    module, cls = _REGISTRY[name]
    return getattr(importlib.import_module(module), cls)(cache_dir=cache_dir or get_settings().resolved_cache_dir(),
                                                         **options)


__all__ = ["HarnessAdapter", "HarnessExit", "HarnessNotInstalled", "Launch", "LaunchContext", "get_harness",
           "harness_names"]
