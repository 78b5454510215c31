"""Which model answers a call, and the policy version it is recorded under (issue 32: the model that answers is the
model recorded).

Harnesses name models themselves: Gemini CLI asks for one model to route and another for the turn, gptme for a
small one to title the conversation, Claude Code for a "fast" one. Forwarded as asked, a call either fails on a
one-model engine or, on an engine serving several models (LoRA adapters, a teacher beside the policy), is answered
by another model while the store records it under the active policy version: training data that says the policy
wrote what another model wrote.

So by default (``ProxySettings.pin_model``) every call is served by the model of the policy version it is recorded
under: the upstream receives that version's ``model_name`` whatever name the request carried, and the record keeps
both (``model``: served; ``metadata.model_requested``: what the harness asked for, where it differed). The answer
still names the model the client asked for, so the harness sees nothing change. ``ProxySettings.model_map`` keeps
names the operator wants kept: a requested name mapped to a policy version is served by that version's model and
recorded under that version, never under the active one (a teacher served by the same engine, or by engine replicas
of its own beside the policy's: the pool sends a call only to a replica that serves its model). A version's model
name is learned when it is registered or activated through this proxy, else read from the store, off the call's
path, the first time a call is recorded under it; until then calls go out with the name they asked for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from forge_store import StoreError


class ServedModels:
    def __init__(self, store=None, *, pin: bool = True, keep: Mapping[str, str] | None = None):
        self.store, self.pin = store, pin
        self.keep = dict(keep or {})  # requested model name -> the policy version that serves it
        self.by_version: dict[str, str] = {}  # policy version -> the model name its engine serves it as
        self._asked: set[str] = set()  # versions looked up once already

    def learn(self, version: str | None, model_name: str | None) -> None:
        if version and model_name:
            self.by_version[version] = model_name

    def lookup(self, version: str) -> None:
        """``version``'s model name from the store's lineage (blocking: call it from a worker thread). A store that
        cannot answer, or a version it does not hold, leaves it to the next registration or activation."""
        if self.store is None or version in self.by_version:
            return
        try:
            rows = self.store.lineage("policy_versions", ids=[version])
        except StoreError:
            return
        for row in rows:
            self.learn(row.get("id"), row.get("model_name"))

    def choose(self, asked: str | None, active: str | None) -> tuple[str | None, str | None, bool]:
        """(the policy version the call is recorded under, the model name the upstream receives, whether the proxy
        chose that name: a kept one, or the version's own; then only a replica that serves it may take the call,
        ``proxy._upstream.pool``)."""
        kept = asked is not None and asked in self.keep
        if kept:
            version = self.keep[asked]
        elif not self.pin or active is None:
            return active, asked, False
        else:
            version = active
        served = self.by_version.get(version)
        if served is None and self.store is not None and version not in self._asked:  # once, off the call's path
            self._asked.add(version)
            asyncio.get_running_loop().run_in_executor(None, self.lookup, version)
        return version, served or asked, kept or served is not None
