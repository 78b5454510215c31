"""The roof over OpenForge's parts: the ``openforge`` command and what spans several parts.

The parts (``forge_store``, ``proxy``, ``rollout``, ``learner``, ``dashboards``) never import this package. It holds
the root command (which discovers each part's commands through entry points, ``openforge.cli``) and the
compositions no single part owns: ``openforge run`` (the orchestrator with a proxy in process), ``openforge demo``
(an engine, the proxy, rollouts, exports, a report) and ``openforge train`` (a learner step in the engine's
environment).
"""
