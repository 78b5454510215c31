"""What the learning loop runs on: the store, the engine behind a recording proxy, sandboxes, a teacher, a trainer.

``Session`` starts each piece into the loop's ``ExitStack`` (so every path stops them) and offers the loop the few
operations it needs: run rollouts of some tasks under the current policy, run the teacher, train, switch.
"""

from __future__ import annotations

import time
from pathlib import Path

BASE_POLICY = "smollm2-135m-instruct"
TEACHER_POLICY = "teacher-scripted"


class Session:
    def __init__(self, cfg, console, stack, report):
        self.cfg, self.console, self.stack, self.report = cfg, console, stack, report
        self.teacher_label = "scripted" if cfg.teacher is None else cfg.teacher

    # ---- start -------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Cheap checks first (bubblewrap, the harness, the port, the model cache), then the store, vLLM, the proxy."""
        from forge_store import get_settings, open_store
        from proxy import ProxySettings
        from proxy.engines import VllmServer, default_cache_dir, ensure_env, ensure_model
        from rollout import AdminClient, get_backend

        from .demo_round import check_model_dir, check_port
        from .embedded_proxy import EmbeddedProxy, own_socket

        cfg, settings = self.cfg, get_settings()
        self.settings = settings
        self.sandbox_root = settings.resolved_sandbox_dir()
        self.sandbox_root.mkdir(parents=True, exist_ok=True)
        self.socket = own_socket(self.sandbox_root)
        self.backend = get_backend("local", root=self.sandbox_root, proxy_socket=self.socket)
        harness = self._harness(0.0)
        if not harness.is_installed():
            raise RuntimeError(f"harness {harness.name!r} is not installed: {harness.install_hint()}")
        if cfg.port:
            check_port(cfg.port)
        self.store = open_store(cfg.store, journal=True, name="demo",
                                settings=settings.model_copy(update={"journal_fsync": ProxySettings().journal_fsync}))
        self.stack.callback(self.store.close)
        with self.console.status("vLLM (CPU build) environment and SmolLM2-135M-Instruct with a tool template: "
                                 "cached after the first run (about 5 min the first time)"):
            ensure_env(cfg.vllm_cache, progress=False)
            self.base_dir = ensure_model(cfg.vllm_cache, progress=False)
        check_model_dir(self.base_dir)
        self.python = default_cache_dir(cfg.vllm_cache) / "venv" / "bin" / "python"
        with self.console.status(f"starting vLLM on 127.0.0.1:{cfg.port} (1.5-4 min on the CPU)"):
            self.server = self.stack.enter_context(VllmServer(cfg.vllm_cache, port=cfg.port or None,
                                                              model=self.base_dir, progress=False))
        self.console.print(f"[green]vLLM[/] serving {self.server.model_name} at {self.server.base_url} "
                           f"(up in {self.server.start_seconds:.0f} s)")
        self.proxy = EmbeddedProxy(self.server.base_url, store=self.store, settings=settings,
                                   socket_path=self.socket)
        self.stack.callback(self.proxy.stop)
        self.admin = AdminClient(self.proxy.url, self.proxy.admin_token)
        self.stack.callback(self.admin.close)
        self.admin.register_policy_version(BASE_POLICY, self.server.model_name, checkpoint_id=str(self.base_dir),
                                           engine="vllm", global_step=0, metadata={"role": "base"})
        self.console.print(f"[green]proxy[/] {self.proxy.url} recording into {self.store.url}")

    def _harness(self, temperature: float):
        from rollout import get_harness

        return get_harness("react", temperature=temperature, max_tokens=self.cfg.max_tokens,
                           max_turns=self.cfg.max_turns)

    # ---- rollouts ----------------------------------------------------------------------------------------------
    def rollouts(self, tasks, *, purpose: str, group_size: int, temperature: float, name: str,
                 backend=None, admin=None, model: str | None = None):
        from rollout import Orchestrator, RunConfig

        from .progress import RunProgress

        harness = self._harness(temperature)
        run_cfg = RunConfig(harness=harness.name, model=model or self.server.model_name, group_size=group_size,
                            concurrency=self.cfg.concurrency, max_turns=self.cfg.max_turns,
                            run_name=f"{name} ({self.cfg.tag})", purpose=purpose)
        with RunProgress(self.console) as progress:
            summary = Orchestrator(run_cfg, store=self.store, backend=backend or self.backend, harness=harness,
                                   admin=admin or self.admin, progress=progress).run(tasks)
        if summary.cancelled:
            raise KeyboardInterrupt
        self._check_run(name, summary)
        if not self.store.flush(120):
            raise RuntimeError("the store did not take every write within 120 s; see `openforge store info`")
        self.runs = getattr(self, "runs", [])
        self.runs.append(summary.run_id)
        return summary

    def _check_run(self, name: str, summary) -> None:
        """Stop the loop when its engine has exited or a whole run was infra errors (every later rollout would be
        one too, and every round "no update"), with the cause."""
        server = getattr(self, "server", None)
        cause = server.exit_cause() if server is not None else None
        infra = sum(r.outcome == "infra_error" for r in summary.results)
        if cause:
            raise RuntimeError(f"the vLLM engine {cause} (during {name!r}: {infra} of {len(summary.results)} rollouts "
                               "were infra errors). Run the loop again; if it recurs, report the log")
        if summary.results and infra == len(summary.results):
            raise RuntimeError(f"every one of the {infra} rollouts of {name!r} was an infra error (the platform's "
                               f"failure, not the policy's), the first: "
                               f"{(summary.results[0].detail or '(no detail)').strip()[:400]}")

    def demonstrations(self, tasks):
        """The teacher's rollouts on ``tasks``, through a second proxy (same store) in front of the teacher."""
        from rollout import AdminClient, get_backend, served_models

        from .embedded_proxy import EmbeddedProxy, own_socket

        if self.cfg.teacher is None:
            url, model, engine = self._scripted_teacher(tasks), "scripted-teacher", "scripted"
            dialect = "vllm"
        else:
            url, engine, dialect = self.cfg.teacher, "api", "openai"
            model = served_models(url)[0]
        sock = own_socket(self.sandbox_root, "teacher")
        proxy = EmbeddedProxy(url, store=self.store, settings=self.settings, socket_path=sock, dialect=dialect)
        self.stack.callback(proxy.stop)
        admin = AdminClient(proxy.url, proxy.admin_token)
        self.stack.callback(admin.close)
        admin.register_policy_version(TEACHER_POLICY if self.cfg.teacher is None else f"teacher-{model}", model,
                                      engine=engine, metadata={"role": "teacher", "scripted": self.cfg.teacher is None,
                                                               "url": self.cfg.teacher})
        backend = get_backend("local", root=self.sandbox_root, proxy_socket=sock)
        if self.cfg.teacher is None:
            self.console.print("[yellow]teacher: a SCRIPTED engine replaying each task's reference solution "
                               "(solution/actions.json) as tool calls, not a model[/]")
        return self.rollouts(tasks, purpose="teacher", group_size=1, temperature=0.0, name="teacher",
                             backend=backend, admin=admin, model=model)

    def _scripted_teacher(self, tasks) -> str:
        from proxy.engines import chat_template
        from proxy.engines.scripted import (
            Conversations,
            ScriptedUpstream,
            UpstreamServer,
            load_smollm2_tokenizer,
            steps_from_actions,
        )

        scripts = {t.instruction.strip(): steps_from_actions(t.solution_actions) for t in tasks if t.solution_actions}
        if not scripts:
            raise RuntimeError("no train task has a reference solution as actions (solution/actions.json); the "
                               "scripted teacher has nothing to play: pass --teacher URL")
        upstream = ScriptedUpstream(tokenizer=load_smollm2_tokenizer(chat_template=chat_template()),
                                    conversations=Conversations(scripts), model="scripted-teacher")
        server = UpstreamServer(upstream)
        url = server.start()
        self.stack.callback(server.stop)
        return url

    # ---- train and switch -------------------------------------------------------------------------------------
    def train(self, shard: Path, version: str, *, parent: str, algorithm: str, **options):
        """Train ``shard`` into ``version`` (``options``: ``learner.train``'s lr, epochs, batch_size, max_seconds,
        optimizer_state, ...)."""
        from learner import train

        out = self.settings.home / "checkpoints" / version
        base = self.base_dir if parent == BASE_POLICY else None
        with self.console.status(f"{algorithm.upper()} on the CPU from {shard.name} -> {version}") as status:
            res = train(self.store, shard, out, python=self.python, base=base, parent=parent, algorithm=algorithm,
                        policy_id=version, progress=self._progress(status, f"{algorithm.upper()} -> {version}"),
                        **options)
        s = res.step
        ratio = s.get("importance_ratio_mean")
        self.console.print(f"[green]{algorithm}[/] {version} (parent {parent}): {s.get('samples')} samples, "
                           f"{s.get('steps')} steps, loss {s.get('loss_first', float('nan')):.4g} -> "
                           f"{s.get('loss', float('nan')):.4g}, {s.get('train_seconds')} s training"
                           + (f", mean importance ratio {ratio:.4f}" if ratio is not None else ""))
        return res

    def _progress(self, status, what: str, every_s: float = 60.0):
        """The step's progress lines: on a terminal in the status line, in a pipe or a log one line a minute (a
        status line does not render there, and an SFT of more than an hour said nothing)."""
        if self.console.is_terminal:
            return lambda line: status.update(f"{what}: {line}")
        last = [float("-inf")]

        def to_log(line: str) -> None:
            if time.monotonic() - last[0] >= every_s:
                last[0] = time.monotonic()
                self.console.print(f"  {what}: {line}", highlight=False)
        return to_log

    def switch(self, res) -> float:
        from .policy_switch import switch_policy

        sw = switch_policy(self.admin, lambda: self.server.load_weights(res.checkpoint), version=res.policy_version,
                           model_name=self.server.model_name)
        self.console.print(f"[green]switched[/] to {res.policy_version} in {sw.switch_s:.2f} s (load "
                           f"{sw.load_s:.2f} s), no restart")
        return sw.switch_s

    def count_calls(self, rows) -> None:
        from forge_store import RolloutFilter

        by_version = {r.version: r for r in rows}
        for run_id in getattr(self, "runs", []):
            infos = list(self.store.iter_rollouts(RolloutFilter(run_id=run_id)))
            calls = self.store.calls_by_rollout([i.id for i in infos])
            for info in infos:
                row = by_version.get(info.policy_version_id)
                if row is not None:
                    row.calls += len(calls.get(info.id, []))
