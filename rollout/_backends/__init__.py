"""Sandbox backends, registered by short name; ``get_backend("nope")`` fails with the list of known names."""

from __future__ import annotations

import importlib

from .base import Mount, Phase, PhaseResult, Resources, Sandbox, SandboxBackend, SandboxError, SandboxSpec

_REGISTRY = {
    "local": ("rollout._backends.local", "LocalBackend"),
    "kubernetes": ("rollout._backends.kubernetes", "KubernetesBackend"),
}


def backend_names() -> list[str]:
    return list(_REGISTRY)


def get_backend(name: str, **options) -> SandboxBackend:
    if name not in _REGISTRY:
        raise KeyError(f"sandbox backend {name!r} is unknown: the known backends are {', '.join(_REGISTRY)}")
    module, cls = _REGISTRY[name]
    return getattr(importlib.import_module(module), cls)(**options)


__all__ = ["Mount", "Phase", "PhaseResult", "Resources", "Sandbox", "SandboxBackend", "SandboxError", "SandboxSpec",
           "backend_names", "get_backend"]
