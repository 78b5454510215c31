"""Shared by the harnesses installed from the npm registry (Codex CLI, Claude Code) into ``CACHE/npm``."""

from __future__ import annotations

import json
from pathlib import Path

from .._backends.base import Mount

MOUNT = "/opt/harness/npm"
CLAUDE_CODE_VERSION = "2.1.197"
CODEX_VERSION = "0.171.0"


def npm_dir(cache_dir: Path) -> Path:
    return cache_dir / "npm"


def package_version(cache_dir: Path, package: str) -> str | None:
    try:
        return json.loads((npm_dir(cache_dir) / "node_modules" / package / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def install_hint(cache_dir: Path) -> str:
    return (f"`make harnesses` (or: npm install --prefix {npm_dir(cache_dir)} @openai/codex@{CODEX_VERSION} "
            f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}); needs Node.js 20+ (apt-get install -y nodejs npm)")


def mount(cache_dir: Path) -> Mount:
    return Mount(npm_dir(cache_dir), MOUNT)


def node_installed() -> bool:
    return Path("/usr/bin/node").exists()
