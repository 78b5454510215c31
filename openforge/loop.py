"""The learning loop on one machine: base -> teacher demonstrations -> SFT -> GRPO rounds, each version evaluated,
and a control that gives SFT the minutes GRPO took.

Every phase goes through the platform's own parts, so the loop is also their integration test:

1. tasks: generated families (``rollout.generate_tasks``: ``files``, ``check``, ``recover``, ``plan``), a train and
   a held-out split per family by seed; the first ``demo_tasks`` train tasks (evenly over the families, or weighted
   by ``demo_mix`` and of ``demo_min_steps`` or more steps: ``openforge.loop_tasks``) are the ones the teacher
   demonstrates, GRPO draws from every train task, the undemonstrated ones first;
2. the engine (vLLM on the CPU, ``proxy.engines.VllmServer``) serves the base model behind a recording proxy; the
   base is evaluated on the held-out split (rollouts marked ``eval``, greedy decoding);
3. a teacher solves the demonstration tasks with the same harness, through a second recording proxy in front of a
   scripted engine that replays each task's reference solution, or in front of any OpenAI-compatible model
   (``--teacher URL``); its rollouts are marked ``teacher``. The scripted teacher knows what a workspace hides, but
   on a ``careful`` share of steps it looks first or recovers (``examples/generated-tasks.md``);
4. SFT: an SFT export of the teacher's rollouts (``learner.export``) trains the base (``learner.train``, assistant
   tokens only) for ``sft_epochs`` epochs into a new policy version, which the engine loads in place behind the
   proxy's fence (``openforge.policy_switch``) and which is evaluated like the base. With ``sft_stage_epochs`` the
   epochs run in stages (one AdamW throughout, constant learning rate), each stage a version evaluated greedily on
   validation tasks (train tasks the teacher did not demonstrate, never held-out ones); SFT stops at the first stage
   whose validation success does not rise above the best so far, and the best stage is the SFT version: SFT "until
   held-out success stops rising", measured without touching the held-out split;
5. GRPO rounds (the recipe: ``openforge.loop_recipe``): groups of sampled rollouts on train tasks, a veRL export with
   GRPO advantages, PPO mini-batch updates with one AdamW kept from round to round, a fenced switch; a round whose
   groups all got equal rewards has no signal, trains nothing and says so; with the recipe's ``signal_groups`` a
   round keeps drawing new tasks until it holds that many groups with a spread of reward (DAPO's dynamic sampling,
   ``openforge.loop_sampling``); the last version is evaluated;
6. the control ``sft_extended``: the SFT version trained on the same demonstrations for as many more seconds as the
   GRPO rounds took (same optimizer state), evaluated like the others, so that GRPO's gain is measured against SFT
   given the same time, not against an SFT stopped early.

Evaluation rollouts never reach a shard and teacher rollouts never a GRPO shard (the learner's exclusions). The
result is a chain of policy versions whose lineage (parent, shard, watermark, samples) is in the store
(``openforge lineage VERSION``), a scoreboard (``openforge.scoreboard``) and paired comparisons by task
(``openforge.loop_report``).
"""

from __future__ import annotations

import shutil
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from .loop_recipe import GrpoRecipe
from .loop_sampling import UNGRADED, RoundSampler
from .loop_tasks import grpo_pool, pick_demonstrations, shares, take_turns
from .loop_session import BASE_POLICY
from .scoreboard import Rate, VersionRow

FAMILIES = ("files", "check", "recover", "plan")


class LoopError(RuntimeError):
    """A precondition of the loop that does not hold; the message says what to do."""


@dataclass
class LoopConfig:
    out: Path  # tasks, shards, checkpoints and optimizer state of this loop
    seed: int = 0
    families: tuple[str, ...] = FAMILIES
    train_tasks: int = 96      # the pool GRPO draws from (split evenly over the families)
    demo_tasks: int = 48       # the first of them, the ones the teacher demonstrates
    demo_mix: dict = field(default_factory=dict)   # family -> weight of its share of demo_tasks (1 where unnamed)
    demo_min_steps: int = 1    # demonstrate only train tasks of this many steps or more
    heldout_tasks: int = 48
    careful: float = 0.0       # share of check/recover steps the teacher solves carefully (looks first, recovers)
    eval_samples: int = 0      # > 0: also this many rollouts per held-out task sampled at the GRPO temperature
    concurrency: int = 16
    max_turns: int = 5
    max_tokens: int = 96
    sft_epochs: int = 3        # with sft_stage_epochs: the most epochs SFT may run
    sft_stage_epochs: int = 0  # > 0: SFT in stages of this many epochs until validation success stops rising
    sft_val_tasks: int = 32    # validation tasks of the staged SFT (train tasks the teacher did not demonstrate)
    sft_lr: float = 1e-4
    sft_train_layers: int = 0  # > 0: SFT (and its control) trains only the last K decoder blocks
    recipe: GrpoRecipe = field(default_factory=GrpoRecipe)
    control: bool = True       # evaluate sft_extended too
    teacher: str | None = None  # an OpenAI-compatible teacher instead of the scripted one
    port: int = 18300
    store: str | None = None
    vllm_cache: str | None = None
    tag: str = field(default_factory=lambda: time.strftime("%m%d%H%M"))

    # what the session and the summary read under their old names
    @property
    def rounds(self) -> int:
        return self.recipe.rounds

    def sft_options(self) -> dict:
        """``learner.train``'s keywords every SFT update of the loop shares (stages and control alike)."""
        return {"lr": self.sft_lr, "train_layers": self.sft_train_layers or None}

    def check(self) -> None:
        from rollout import task_families

        for name in ("train_tasks", "demo_tasks", "heldout_tasks", "concurrency", "max_turns", "sft_epochs"):
            if getattr(self, name) < 1:
                raise LoopError(f"--{name.replace('_', '-')} {getattr(self, name)}: pass 1 or more")
        if not 0 <= self.careful <= 1:
            raise LoopError(f"--careful {self.careful}: a share of steps, from 0 to 1 (e.g. 0.5)")
        if self.eval_samples < 0 or self.eval_samples == 1:
            raise LoopError(f"--eval-samples {self.eval_samples}: pass 0 (greedy evaluation only) or 2 or more "
                            "sampled rollouts per held-out task (e.g. 4); one sample says less than the greedy one")
        if self.sft_train_layers < 0:
            raise LoopError(f"--sft-train-layers {self.sft_train_layers}: pass 0 (every weight) or the number of last "
                            "decoder blocks SFT trains")
        if self.sft_stage_epochs < 0 or self.sft_stage_epochs > self.sft_epochs:
            raise LoopError(f"--sft-stage-epochs {self.sft_stage_epochs}: pass 0 (one go) or 1 to --sft-epochs "
                            f"({self.sft_epochs}), the most epochs the stages may add up to")
        if self.sft_stage_epochs and not 1 <= self.sft_val_tasks <= self.train_tasks - self.demo_tasks:
            raise LoopError(f"--sft-val-tasks {self.sft_val_tasks}: staged SFT validates on train tasks the teacher "
                            f"did not demonstrate, of which there are {self.train_tasks - self.demo_tasks}; pass 1 to "
                            f"{self.train_tasks - self.demo_tasks}, or raise --train-tasks")
        if self.demo_tasks > self.train_tasks:
            raise LoopError(f"--demo-tasks {self.demo_tasks} is more than --train-tasks {self.train_tasks}: the "
                            f"teacher demonstrates train tasks; pass --demo-tasks {self.train_tasks} or fewer")
        known = task_families()
        unknown = [f for f in self.families if f not in known]
        if unknown or not self.families:
            raise LoopError(f"--families {','.join(self.families) or '(none)'}: unknown {', '.join(unknown)}; "
                            f"the families are {', '.join(known)}")
        for name in ("train_tasks", "demo_tasks", "heldout_tasks"):
            if getattr(self, name) < len(self.families):
                raise LoopError(f"--{name.replace('_', '-')} {getattr(self, name)}: fewer than the "
                                f"{len(self.families)} families; pass at least one task per family")
        if self.demo_min_steps < 1:
            raise LoopError(f"--demo-min-steps {self.demo_min_steps}: pass 1 (every task) or more")
        shares(self.demo_tasks, self.families, self.demo_mix)   # raises on a family not in the loop
        self.recipe.check()


@dataclass
class LoopReport:
    rows: list[VersionRow] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    switches: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)  # mean importance ratio of each GRPO update's first batch
    k3s: list[float] = field(default_factory=list)  # k3 of KL(engine || trainer) over the same tokens
    rounds_trained: int = 0
    eval_runs: dict[str, str] = field(default_factory=dict)  # version -> its held-out evaluation run
    sampled_runs: dict[str, str] = field(default_factory=dict)  # version -> its sampled held-out evaluation run
    grpo_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    sft_curve: list[dict] = field(default_factory=list)  # staged SFT: epochs, version, validation success
    draws: list[dict] = field(default_factory=list)  # each GRPO round's draws, groups with spread, groups kept

    def row(self, version: str) -> VersionRow:
        return next(r for r in self.rows if r.version == version)

    def made_by(self, what: str) -> VersionRow | None:
        return next((r for r in self.rows if r.made_by == what), None)


class LearningLoop:
    """One run of the loop; ``run()`` returns its report. Everything it starts is stopped on every path."""

    def __init__(self, cfg: LoopConfig, console):
        cfg.check()
        self.cfg, self.console = cfg, console
        self.report = LoopReport()
        self.optimizer = cfg.out / "optimizer" / cfg.tag
        self.sft_shard: Path | None = None   # the demonstrations' SFT export (the recipe's sft_anchor trains on it)

    # ---- the whole loop ---------------------------------------------------------------------------------------
    def run(self) -> LoopReport:
        from .loop_session import Session

        train, demos, heldout = self._phase("tasks", self.tasks)
        with ExitStack() as stack:
            s = self.session = Session(self.cfg, self.console, stack, self.report)
            self._phase("engine start", s.start)
            self.add_version(BASE_POLICY, None, "base")
            self._phase("eval base", self.evaluate, BASE_POLICY, heldout)
            teacher_run = self._phase("teacher demonstrations", self._demonstrate, demos)
            val = [t for t in train if t not in demos][:self.cfg.sft_val_tasks]
            sft, sft_shard = self._phase("sft", self._sft, teacher_run, val)
            self.sft_shard = sft_shard
            self._phase(f"eval {sft}", self.evaluate, sft, heldout)
            current, t0 = sft, time.monotonic()
            self.sampler = RoundSampler(grpo_pool(train, demos), self.cfg.recipe)
            for r in range(1, self.cfg.recipe.rounds + 1):
                current = self._phase(f"grpo round {r}", self.grpo_round, r, current)
            self.report.grpo_seconds = time.monotonic() - t0
            if current != sft:
                self._phase(f"eval {current}", self.evaluate, current, heldout)
            if self.cfg.control and self.report.grpo_seconds > 0 and current != sft:
                control = self._phase("sft extended (control)", self._sft_extended, sft, sft_shard)
                self._phase(f"eval {control}", self.evaluate, control, heldout)
            s.count_calls(self.report.rows)
        return self.report

    def _phase(self, name: str, fn, *args):
        t0 = time.monotonic()
        self.console.print(f"[bold]{name}[/]")
        try:
            return fn(*args)
        finally:
            self.report.phases[name] = self.report.phases.get(name, 0.0) + time.monotonic() - t0

    def add_version(self, version: str, parent: str | None, made_by: str, samples: int | None = None) -> VersionRow:
        """``version`` joins the report's chain (its parent, what made it, how many samples trained it)."""
        row = VersionRow(version, parent, made_by, samples=samples)
        self.report.rows.append(row)
        return row

    # ---- phases (public: the benches compose them, bench/sft_plateau.py and bench/grpo_sweep.py) -------------
    def tasks(self):
        """Generate every family's tasks; returns (train tasks, families interleaved; the demonstrated ones;
        held-out)."""
        from rollout import generate_tasks, load_task

        cfg = self.cfg
        n_train, n_heldout = shares(cfg.train_tasks, cfg.families, {}), shares(cfg.heldout_tasks, cfg.families, {})
        per_family, heldout = {}, []
        for family in cfg.families:
            out = cfg.out / "tasks" / (f"{family}-seed{cfg.seed}" + (f"-careful{cfg.careful:g}" if cfg.careful else ""))
            paths = generate_tasks(family, out, train=n_train[family], heldout=n_heldout[family], seed=cfg.seed,
                                   careful=cfg.careful)
            tasks = [load_task(p) for p in paths]
            per_family[family] = [t for t in tasks if t.config.metadata.get("split") == "train"]
            heldout += [t for t in tasks if t.config.metadata.get("split") == "heldout"]
        demos = pick_demonstrations(per_family, shares(cfg.demo_tasks, cfg.families, cfg.demo_mix),
                                    cfg.demo_min_steps)
        # the families interleaved, so that every GRPO round draws from each of them
        train = take_turns(list(per_family.values()))
        self.console.print(f"{len(train)} train tasks ({len(demos)} demonstrated) and {len(heldout)} held-out tasks "
                           f"of families {', '.join(cfg.families)} (seed {cfg.seed}) in {cfg.out / 'tasks'}")
        return train, demos, heldout

    def evaluate(self, version: str, tasks) -> Rate:
        """One greedy rollout of the engine's current policy on each task, recorded as ``version``'s evaluation;
        with ``eval_samples`` also that many rollouts per task sampled at the GRPO temperature (their own run: the
        policy GRPO optimises, and a success rate per task instead of one coin, so a paired difference is seen with
        fewer tasks)."""
        summary = self.session.rollouts(tasks, purpose="eval", group_size=1, temperature=0.0, name=f"eval {version}")
        rate = _rate(summary)
        self.report.row(version).heldout = rate
        self.report.eval_runs[version] = summary.run_id
        self.console.print(f"held-out success of [bold]{version}[/]: {rate.text()}")
        if self.cfg.eval_samples:
            t = self.cfg.recipe.temperature
            sampled = self.session.rollouts(tasks, purpose="eval", group_size=self.cfg.eval_samples, temperature=t,
                                            name=f"eval sampled {version}")
            self.report.row(version).sampled = _rate(sampled)
            self.report.sampled_runs[version] = sampled.run_id
            self.console.print(f"held-out success of [bold]{version}[/] sampled ({self.cfg.eval_samples} a task at "
                               f"temperature {t}): {self.report.row(version).sampled.text()}")
        return rate

    def _demonstrate(self, demos) -> str:
        summary = self.session.demonstrations(demos)
        rate = _rate(summary)
        self.console.print(f"teacher ({self.session.teacher_label}) solved {rate.text()} of the demonstration tasks")
        if not rate.successes:
            raise LoopError("the teacher solved no train task, so there is nothing to learn from; check the teacher "
                            "(--teacher URL) or the task family")
        return summary.run_id

    def _sft(self, teacher_run: str, val) -> tuple[str, Path]:
        from learner import ExportConfig, export

        shard = self.cfg.out / "shards" / f"sft-{teacher_run}"
        manifest = export(self.session.store, shard, ExportConfig(format="sft", where=f"run_id = '{teacher_run}'"))
        self.optimizer.mkdir(parents=True, exist_ok=True)
        if not self.cfg.sft_stage_epochs:
            version = f"smollm2-{self.cfg.tag}-sft"
            res = self.session.train(shard, version, parent=BASE_POLICY, algorithm="sft", **self.cfg.sft_options(),
                                     epochs=self.cfg.sft_epochs, optimizer_state=self.optimizer / "sft.pt")
            self.add_version(version, BASE_POLICY, "sft", samples=_rows(manifest))
            self.report.switches.append(self.session.switch(res))
            return version, shard
        return self._sft_stages(shard, _rows(manifest), val), shard

    def _sft_stages(self, shard: Path, samples: int, val) -> str:
        """SFT in stages until validation success stops rising; the best stage becomes the SFT version."""
        cfg, state = self.cfg, self.optimizer / "sft.pt"
        parent, done, best, results = BASE_POLICY, 0, None, {}
        while done < cfg.sft_epochs:
            epochs = min(cfg.sft_stage_epochs, cfg.sft_epochs - done)
            done += epochs
            version = f"smollm2-{cfg.tag}-sft-e{done}"
            res = self.session.train(shard, version, parent=parent, algorithm="sft", **cfg.sft_options(), epochs=epochs,
                                     optimizer_state=state)
            shutil.copyfile(state, self.optimizer / f"{version}.pt")
            row = self.add_version(version, parent, "sft stage", samples=samples)
            self.report.switches.append(self.session.switch(res))
            summary = self.session.rollouts(val, purpose="eval", group_size=1, temperature=0.0,
                                            name=f"validate {version}")
            row.validation, results[version] = _rate(summary), res
            self.report.sft_curve.append({"epochs": done, "version": version, "validation": row.validation.value,
                                          "run_id": summary.run_id})
            self.console.print(f"SFT after {done} epochs: validation success {row.validation.text()} on "
                               f"{len(val)} train tasks the teacher did not demonstrate")
            now = row.validation.value or 0.0
            if best is not None and now <= (top := self.report.row(best).validation.value or 0.0):
                self.console.print(f"validation success stopped rising ({now:.3f} after {done} epochs, {top:.3f} "
                                   f"at best): SFT stops")
                break
            best, parent = version, version
        self.report.row(best).made_by = "sft"
        shutil.copyfile(self.optimizer / f"{best}.pt", state)   # the control continues from the chosen stage
        if best != version:   # the last stage overshot: the engine serves the chosen one again
            self.report.switches.append(self.session.switch(results[best]))
        self.console.print(f"SFT version: {best} (best validation success along the stages)")
        return best

    def grpo_round(self, r: int, current: str) -> str:
        """Round ``r`` of the recipe from ``current``: sample groups on the round's tasks, export a veRL shard,
        update, switch the engine to the new version; returns it (``current`` when no update could be made)."""
        from learner import ExportConfig, TrainError, export

        recipe = self.cfg.recipe
        draws = self.sampler.draw(lambda tasks, name: self.session.rollouts(
            tasks, purpose="train", group_size=recipe.group_size, temperature=recipe.temperature, name=name),
            f"grpo round {r} {current}")
        self.report.draws.append({"round": r, **draws.as_dict()})
        row = self.report.row(current)
        for rate in map(_rate, draws.summaries):
            row.train = Rate(row.train.successes + rate.successes, row.train.n + rate.n)
        if recipe.signal_groups:
            self.console.print(f"round {r}: {len(draws.spread)} groups with a spread of reward in {len(draws.runs)} "
                               f"draw(s) of {recipe.tasks_per_round}; trains on {len(draws.keep)}: {draws.kept_text()}")
            if not draws.keep:
                note = f"round {r}: no update (no group with a spread of reward in {len(draws.runs)} draws)"
                self.report.notes.append(note)
                self.console.print(f"[yellow]{note}[/]")
                return current
        shard = self.cfg.out / "shards" / f"grpo-{draws.runs[0]}"
        # A completion cut at max_tokens is a failure the policy produced, not noise: it trains, with its advantage.
        manifest = export(self.session.store, shard, ExportConfig(format="verl", where=draws.where(),
                                                                  keep_truncated=True,
                                                                  norm_by_std=recipe.norm_by_std,
                                                                  call_cost=recipe.call_cost,
                                                                  success_at=1.0 if recipe.success_only else None))
        version = f"smollm2-{self.cfg.tag}-grpo{r}"
        state = self.optimizer / "grpo.pt"   # GRPO's own AdamW: new at round 1, then kept from round to round
        try:
            res = self.session.train(shard, version, parent=current, algorithm="grpo",
                                     optimizer_state=state if recipe.carries_optimizer else None,
                                     **recipe.train_options(), **self._anchor(), **self._kl())
        except TrainError as exc:
            note = f"round {r}: no update ({exc})"
            self.report.notes.append(note)
            self.console.print(f"[yellow]{note}[/]")
            return current
        for key, seen in (("importance_ratio_mean", self.report.ratios), ("importance_k3", self.report.k3s)):
            if res.step.get(key) is not None:
                seen.append(res.step[key])
        self.add_version(version, current, f"grpo round {r}", samples=_rows(manifest))
        self.report.switches.append(self.session.switch(res))
        self.report.rounds_trained += 1
        return version

    def _anchor(self) -> dict:
        """The recipe's SFT anchor (PPO-ptx): the demonstrations' export and its weight, or nothing."""
        if not self.cfg.recipe.sft_anchor:
            return {}
        if self.sft_shard is None:
            raise ValueError("the recipe's sft_anchor needs the demonstrations' SFT export; this loop has none")
        return {"anchor": self.sft_shard, "anchor_coef": self.cfg.recipe.sft_anchor,
                "anchor_batch_size": self.cfg.recipe.anchor_batch_size}

    def _kl(self) -> dict:
        """The recipe's KL term: its weight and the SFT version the rounds started from, or nothing."""
        sft = self.report.made_by("sft")
        if not self.cfg.recipe.kl_coef:
            return {}
        if sft is None:
            raise ValueError("the recipe's kl_coef needs the SFT version as its reference; this loop has none")
        return {"kl_coef": self.cfg.recipe.kl_coef, "reference": sft.version}

    def _sft_extended(self, sft: str, shard: Path) -> str:
        """SFT on the same demonstrations from the SFT version, for the seconds the GRPO rounds took."""
        version = f"smollm2-{self.cfg.tag}-sft-extended"
        state = self.optimizer / "control.pt"
        if (self.optimizer / "sft.pt").exists():
            shutil.copyfile(self.optimizer / "sft.pt", state)
        budget = round(self.report.grpo_seconds, 1)
        res = self.session.train(shard, version, parent=sft, algorithm="sft", **self.cfg.sft_options(), epochs=1000,
                                 max_seconds=budget, optimizer_state=state)
        row = self.add_version(version, sft, "sft extended (control)", samples=res.step.get("samples"))
        row.seconds["train_budget_s"] = budget
        self.console.print(f"control: SFT continued for {res.step.get('train_seconds')} s of training "
                           f"({res.step.get('epochs')} more epochs) against GRPO's {budget} s")
        self.report.switches.append(self.session.switch(res))
        return version


def _rate(summary) -> Rate:
    graded = [r for r in summary.results if r.outcome not in UNGRADED]
    return Rate(sum(r.outcome == "success" for r in graded), len(graded))


def _rows(manifest: dict) -> int:
    rows = manifest["counts"]["rows"]
    return rows.get("trajectories", rows.get("sft", sum(rows.values())))
