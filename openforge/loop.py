"""The learning loop on one machine: base -> teacher demonstrations -> SFT -> GRPO rounds, each version evaluated.

Every phase goes through the platform's own parts, so the loop is also their integration test:

1. tasks: a generated family (``rollout.generate_tasks``), a train split and a held-out split by seed;
2. the engine (vLLM on the CPU, ``proxy.engines.VllmServer``) serves the base model behind a recording proxy; the
   base is evaluated on the held-out split (rollouts marked ``eval``, greedy decoding);
3. a teacher solves the train split with the same harness, through a second recording proxy in front of a scripted
   engine that replays each task's reference solution (``proxy.testing.Conversations``), or in front of any
   OpenAI-compatible model (``--teacher URL``); its rollouts are marked ``teacher``;
4. SFT: an SFT export of the teacher's rollouts (``learner.export``) trains the base (``learner.train``, assistant
   tokens only) into a new policy version, which the engine loads in place behind the proxy's fence
   (``openforge.policy_switch``) and which is evaluated like the base;
5. GRPO rounds: groups of sampled rollouts on train tasks (``train``), a veRL export with GRPO advantages, one
   policy update, a fenced switch, an evaluation; a round whose groups all got equal rewards has no signal, trains
   nothing and says so.

Evaluation rollouts never reach a shard and teacher rollouts never a GRPO shard (the learner's exclusions). The
result is a chain of policy versions whose lineage (parent, shard, watermark, samples) is in the store
(``openforge lineage VERSION``) and a scoreboard (``openforge.scoreboard``).
"""

from __future__ import annotations

import statistics
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from .loop_session import BASE_POLICY
from .scoreboard import Rate, VersionRow

FAMILY = "files"


class LoopError(RuntimeError):
    """A precondition of the loop that does not hold; the message says what to do."""


@dataclass
class LoopConfig:
    out: Path  # tasks, shards and checkpoints of this loop
    seed: int = 0
    train_tasks: int = 32
    heldout_tasks: int = 16
    rounds: int = 1
    tasks_per_round: int = 8
    group_size: int = 4
    concurrency: int = 4
    max_turns: int = 4
    max_tokens: int = 96
    train_temperature: float = 1.0
    sft_epochs: int = 3
    sft_lr: float = 1e-4
    grpo_lr: float = 2e-5
    grpo_epochs: int = 1  # passes over a round's shard
    grpo_batch_size: int | None = None  # samples per update (None: the whole shard in one update)
    teacher: str | None = None  # an OpenAI-compatible teacher instead of the scripted one
    port: int = 18300
    store: str | None = None
    vllm_cache: str | None = None
    tag: str = field(default_factory=lambda: time.strftime("%m%d%H%M"))

    def check(self) -> None:
        for name in ("train_tasks", "heldout_tasks", "tasks_per_round", "concurrency", "max_turns", "sft_epochs"):
            if getattr(self, name) < 1:
                raise LoopError(f"--{name.replace('_', '-')} {getattr(self, name)}: pass 1 or more")
        if self.group_size < 2:
            raise LoopError(f"--group-size {self.group_size}: a GRPO group needs at least 2 rollouts to compare; "
                            f"pass --group-size 2 or more")
        if self.rounds < 0:
            raise LoopError(f"--rounds {self.rounds}: pass 0 (SFT only) or more")


@dataclass
class LoopReport:
    rows: list[VersionRow] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    switches: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)  # mean importance ratio of each GRPO update's first batch
    rounds_trained: int = 0
    notes: list[str] = field(default_factory=list)

    def row(self, version: str) -> VersionRow:
        return next(r for r in self.rows if r.version == version)


class LearningLoop:
    """One run of the loop; ``run()`` returns its report. Everything it starts is stopped on every path."""

    def __init__(self, cfg: LoopConfig, console):
        cfg.check()
        self.cfg, self.console = cfg, console
        self.report = LoopReport()

    # ---- the whole loop ---------------------------------------------------------------------------------------
    def run(self) -> LoopReport:
        from .loop_session import Session

        train, heldout = self._phase("tasks", self._tasks)
        with ExitStack() as stack:
            s = self.session = Session(self.cfg, self.console, stack, self.report)
            self._phase("engine start", s.start)
            self._add(BASE_POLICY, None, "base")
            self._phase("eval base", self._evaluate, BASE_POLICY, heldout)
            teacher_run = self._phase("teacher demonstrations", self._demonstrate, train)
            current = self._phase("sft", self._sft, teacher_run)
            self._phase(f"eval {current}", self._evaluate, current, heldout)
            for r in range(1, self.cfg.rounds + 1):
                current = self._phase(f"grpo round {r}", self._grpo_round, r, current, train)
                if self.report.rows[-1].version == current and self.report.rows[-1].heldout.n == 0:
                    self._phase(f"eval {current}", self._evaluate, current, heldout)
            s.count_calls(self.report.rows)
        return self.report

    def _phase(self, name: str, fn, *args):
        t0 = time.monotonic()
        self.console.print(f"[bold]{name}[/]")
        try:
            return fn(*args)
        finally:
            self.report.phases[name] = self.report.phases.get(name, 0.0) + time.monotonic() - t0

    def _add(self, version: str, parent: str | None, made_by: str, samples: int | None = None) -> VersionRow:
        row = VersionRow(version, parent, made_by, samples=samples)
        self.report.rows.append(row)
        return row

    # ---- phases -----------------------------------------------------------------------------------------------
    def _tasks(self):
        from rollout import generate_tasks, load_task

        out = self.cfg.out / "tasks" / f"{FAMILY}-seed{self.cfg.seed}"
        paths = generate_tasks(FAMILY, out, train=self.cfg.train_tasks, heldout=self.cfg.heldout_tasks,
                               seed=self.cfg.seed)
        tasks = [load_task(p) for p in paths]
        train = [t for t in tasks if t.config.metadata.get("split") == "train"]
        heldout = [t for t in tasks if t.config.metadata.get("split") == "heldout"]
        self.console.print(f"{len(train)} train and {len(heldout)} held-out tasks of family {FAMILY!r} "
                           f"(seed {self.cfg.seed}) in {out}")
        return train, heldout

    def _evaluate(self, version: str, tasks) -> Rate:
        summary = self.session.rollouts(tasks, purpose="eval", group_size=1, temperature=0.0,
                                        name=f"eval {version}")
        rate = _rate(summary)
        self.report.row(version).heldout = rate
        self.console.print(f"held-out success of [bold]{version}[/]: {rate.text()}")
        return rate

    def _demonstrate(self, train) -> str:
        summary = self.session.demonstrations(train)
        rate = _rate(summary)
        self.console.print(f"teacher ({self.session.teacher_label}) solved {rate.text()} of the train tasks")
        if not rate.successes:
            raise LoopError("the teacher solved no train task, so there is nothing to learn from; check the teacher "
                            "(--teacher URL) or the task family")
        return summary.run_id

    def _sft(self, teacher_run: str) -> str:
        from learner import ExportConfig, export

        shard = self.cfg.out / "shards" / f"sft-{teacher_run}"
        manifest = export(self.session.store, shard, ExportConfig(format="sft", where=f"run_id = '{teacher_run}'"))
        version = f"smollm2-{self.cfg.tag}-sft"
        res = self.session.train(shard, version, parent=BASE_POLICY, algorithm="sft", lr=self.cfg.sft_lr,
                                 epochs=self.cfg.sft_epochs)
        self._add(version, BASE_POLICY, "sft", samples=_rows(manifest))
        self.report.switches.append(self.session.switch(res))
        return version

    def _grpo_round(self, r: int, current: str, train) -> str:
        from learner import ExportConfig, TrainError, export

        k = self.cfg.tasks_per_round
        start = ((r - 1) * k) % len(train)
        tasks = (train[start:] + train[:start])[:k]
        summary = self.session.rollouts(tasks, purpose="train", group_size=self.cfg.group_size,
                                        temperature=self.cfg.train_temperature, name=f"grpo round {r} {current}")
        rate = _rate(summary)
        row = self.report.row(current)
        row.train = Rate(row.train.successes + rate.successes, row.train.n + rate.n)
        shard = self.cfg.out / "shards" / f"grpo-{summary.run_id}"
        # A completion cut at max_tokens is a failure the policy produced, not noise: it trains, with its advantage.
        manifest = export(self.session.store, shard, ExportConfig(format="verl", where=f"run_id = '{summary.run_id}'",
                                                                  keep_truncated=True))
        version = f"smollm2-{self.cfg.tag}-grpo{r}"
        try:
            res = self.session.train(shard, version, parent=current, algorithm="grpo", lr=self.cfg.grpo_lr,
                                     epochs=self.cfg.grpo_epochs, batch_size=self.cfg.grpo_batch_size)
        except TrainError as exc:
            note = f"round {r}: no update ({exc})"
            self.report.notes.append(note)
            self.console.print(f"[yellow]{note}[/]")
            return current
        if res.step.get("mean_ratio") is not None:
            self.report.ratios.append(res.step["mean_ratio"])
        self._add(version, current, f"grpo round {r}", samples=_rows(manifest))
        self.report.switches.append(self.session.switch(res))
        self.report.rounds_trained += 1
        return version


def _rate(summary) -> Rate:
    graded = [r for r in summary.results if r.outcome not in ("infra_error", "cancelled")]
    return Rate(sum(r.outcome == "success" for r in graded), len(graded))


def _rows(manifest: dict) -> int:
    rows = manifest["counts"]["rows"]
    return rows.get("trajectories", rows.get("sft", sum(rows.values())))


def summary_json(report: LoopReport, started: float) -> dict:
    """The loop's last line: what ``bench/learning_curve.py`` reads and the issue's targets name."""
    from .scoreboard import difference

    base, final = report.rows[0], report.rows[-1]
    sft = next((r for r in report.rows if r.made_by == "sft"), None)
    d_final_base, ci_final_base = difference(final.heldout, base.heldout)
    d_final_sft, ci_final_sft = difference(final.heldout, sft.heldout) if sft else (None, None)
    return {
        "success_base": base.heldout.value, "success_sft": sft.heldout.value if sft else None,
        "success_final": final.heldout.value, "final_version": final.version,
        "final_minus_base": d_final_base, "final_minus_base_ci95": ci_final_base,
        "final_minus_sft": d_final_sft, "final_minus_sft_ci95": ci_final_sft,
        "rounds": report.rounds_trained, "minutes": round((time.monotonic() - started) / 60, 2),
        "switch_s_p50": round(statistics.median(report.switches), 3) if report.switches else None,
        "importance_ratio_mean": round(statistics.fmean(report.ratios), 5) if report.ratios else None,
        "phases_s": {k: round(v, 1) for k, v in report.phases.items()},
        "versions": [r.as_dict() for r in report.rows], "notes": report.notes,
    }
