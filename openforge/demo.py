"""``openforge demo``: the main job. By default the learning loop on this machine (``openforge.loop``); with
``--tasks``, ``--upstream`` or ``--policy``, one recorded round on your tasks, server or checkpoint
(``openforge.demo_round``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

import typer
from rollout import harness_names

from .loop import FAMILIES
from .loop_recipe import GrpoRecipe
from .loop_tasks import parse_mix, shares
from .progress import sigterm_interrupts


def demo_command(
    upstream: Optional[str] = typer.Option(None, "--upstream", help="One recorded round against this vLLM / SGLang "
                                           "server (your GPU) instead of the learning loop on the CPU."),
    harness: str = typer.Option("react", "--harness", help=f"One of {', '.join(harness_names())} (one round; the "
                                "learning loop uses react)."),
    tasks: Optional[Path] = typer.Option(None, "--tasks", help="One recorded round on your task folder(s)."),
    policy: Optional[str] = typer.Option(None, "--policy", help="One recorded round serving this policy version's "
                                         "checkpoint (registered by `openforge train`)."),
    rounds: int = typer.Option(3, "--rounds", help="GRPO rounds after SFT (the loop); 0 stops after SFT."),
    families: str = typer.Option(",".join(FAMILIES), "--families", help="Generated task families, comma-separated "
                                 "(openforge tasks families)."),
    train_tasks: int = typer.Option(96, "--train-tasks", help="Generated train tasks, over the families (GRPO "
                                    "rounds draw from them)."),
    demo_tasks: int = typer.Option(48, "--demo-tasks", help="Of the train tasks, how many the teacher "
                                   "demonstrates (the SFT data)."),
    demo_mix: str = typer.Option("", "--demo-mix", help="Weights of the families' shares of --demo-tasks, e.g. "
                                 "check=2,recover=2 (families not named weigh 1; default: even)."),
    demo_min_steps: int = typer.Option(1, "--demo-min-steps", help="Demonstrate only train tasks of this many "
                                       "steps or more (e.g. 2: no one-step tasks)."),
    heldout_tasks: int = typer.Option(48, "--heldout-tasks", help="Generated held-out tasks every version is "
                                      "evaluated on."),
    careful: float = typer.Option(0.0, "--careful", help="Share of the check and recover steps the scripted teacher "
                                  "solves carefully (looks at the file first, or meets the error and recovers) instead "
                                  "of knowing what the step hides; the rest it solves in one privileged call."),
    eval_samples: int = typer.Option(0, "--eval-samples", help="Also evaluate every version with this many "
                                     "rollouts per held-out task sampled at --temperature (the policy GRPO trains; "
                                     "success averaged per task, paired by task); 0: greedy only."),
    tasks_per_round: int = typer.Option(8, "--tasks-per-round", help="Train tasks per GRPO round (one group each); "
                                        "with --signal-groups, per draw."),
    signal_groups: int = typer.Option(GrpoRecipe.signal_groups, "--signal-groups", help="DAPO's dynamic sampling: "
                                      "a round draws --tasks-per-round more tasks until it holds this many groups "
                                      "with a spread of reward, and trains on them (0: one draw a round)."),
    max_draws: int = typer.Option(GrpoRecipe.max_draws, "--max-draws", help="With --signal-groups: the most draws "
                                  "a round makes."),
    seed: int = typer.Option(0, "--seed", help="Seed of the generated tasks."),
    teacher: Optional[str] = typer.Option(None, "--teacher", help="An OpenAI-compatible teacher model's URL for the "
                                          "demonstrations (default: the scripted engine replaying each task's "
                                          "reference solution)."),
    sft_epochs: int = typer.Option(3, "--sft-epochs", help="Epochs of SFT over the teacher's demonstrations (with "
                                   "--sft-stage-epochs: the most the stages may add up to)."),
    sft_stage_epochs: int = typer.Option(0, "--sft-stage-epochs", help="SFT in stages of this many epochs, each "
                                         "validated on train tasks the teacher did not demonstrate, until "
                                         "validation success stops rising; the best stage is the SFT version "
                                         "(0: all --sft-epochs in one go)."),
    sft_val_tasks: int = typer.Option(32, "--sft-val-tasks", help="Validation tasks of the staged SFT."),
    grpo_lr: float = typer.Option(GrpoRecipe.lr, "--grpo-lr", help="Learning rate of the GRPO updates."),
    grpo_epochs: int = typer.Option(GrpoRecipe.epochs, "--grpo-epochs", help="Passes over each round's samples."),
    grpo_batch_size: int = typer.Option(GrpoRecipe.batch_size or 0, "--grpo-batch-size", help="Samples per GRPO optimizer step (0: a "
                                        "round's whole shard in one step)."),
    group_size: int = typer.Option(GrpoRecipe.group_size, "--group-size", help="Rollouts per GRPO group."),
    temperature: float = typer.Option(GrpoRecipe.temperature, "--temperature", help="Sampling temperature of the "
                                      "GRPO rounds (evaluation is greedy)."),
    loss_agg: str = typer.Option(GrpoRecipe.loss_agg, "--loss-agg", help="veRL's loss_agg_mode: token-mean, "
                                 "seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm (Dr. GRPO)."),
    clip_high: float = typer.Option(GrpoRecipe.clip_high, "--clip-high", help="Upper PPO clip (clip-higher); the "
                                    "lower one is 0.2."),
    negative_weight: float = typer.Option(GrpoRecipe.negative_weight, "--negative-weight", help="Scale of negative "
                                          "advantages (1: GRPO; 0: only better-than-average rollouts train)."),
    call_cost: float = typer.Option(GrpoRecipe.call_cost, "--call-cost", help="Efficiency shaping of GRPO's "
                                    "rewards: a rollout of n model calls counts reward * (1 - COST)**(n-1)."),
    sft_anchor: float = typer.Option(GrpoRecipe.sft_anchor, "--sft-anchor", help="Weight of the demonstrations' "
                                     "SFT loss joined to every GRPO step (PPO-ptx; 0: none)."),
    anchor_batch_size: int = typer.Option(GrpoRecipe.anchor_batch_size, "--anchor-batch-size", help="Demonstrations "
                                          "in each GRPO step's anchor loss (--sft-anchor); each costs a sample pass."),
    kl_coef: float = typer.Option(GrpoRecipe.kl_coef, "--kl-coef", help="Weight of a KL(policy || SFT) term in "
                                  "every GRPO step (veRL's low_var_kl; 0: none; e.g. 0.01). Costs a reference "
                                  "forward pass a sample."),
    success_only: bool = typer.Option(GrpoRecipe.success_only, "--success-only", help="GRPO's advantages from "
                                      "success or failure alone (reward 1 or not), not the verifier's partial credit."),
    dr_grpo: bool = typer.Option(False, "--dr-grpo", help="Advantages mean-centred only (no division by the "
                                 "group's std)."),
    fresh_optimizer: bool = typer.Option(False, "--fresh-optimizer", help="A new AdamW every round instead of one "
                                         "kept from round to round."),
    lora_rank: int = typer.Option(GrpoRecipe.lora_rank, "--lora-rank", help="GRPO rounds train a rank-r adapter "
                                  "on every projection, merged after each round (0: every weight)."),
    train_layers: int = typer.Option(0, "--train-layers", help="SFT, its control and the GRPO rounds train only the "
                                     "last K decoder blocks (about 2x faster with 10 of 30 and slower to learn; 0: "
                                     "every weight)."),
    control: bool = typer.Option(True, "--control/--no-control", help="Also train and evaluate sft_extended: SFT "
                                 "given the minutes the GRPO rounds took."),
    groups_per_task: int = typer.Option(1, "--groups-per-task", help="Groups per task (one round)."),
    concurrency: int = typer.Option(16, "--concurrency", help="Rollouts at once."),
    max_turns: int = typer.Option(5, "--max-turns", help="Turns per rollout (react) / steps (mini-swe-agent)."),
    max_tokens: int = typer.Option(96, "--max-tokens", help="Tokens per model call (react)."),
    port: int = typer.Option(18300, "--port", help="Port for the CPU vLLM server."),
    store: Optional[str] = typer.Option(None, "--store", help="Store URL (default: the embedded SQLite store)."),
) -> None:
    """The whole loop on this machine: base eval, teacher demonstrations, SFT, GRPO rounds, every version evaluated on
    held-out tasks, all through the recording proxy and the store; prints a scoreboard and the lineage."""
    from rich.console import Console

    from forge_store import JournalError, StoreError
    from rollout import ProxyUnavailable, SandboxError, TaskError

    console = Console(stderr=True)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=True, width=160)  # a log file: wide enough that the scoreboard's rows stay one line
    errors = (TaskError, SandboxError, ProxyUnavailable, StoreError, JournalError, KeyError, ValueError, RuntimeError,
              TimeoutError)   # LoopError and RecipeError are RuntimeError and ValueError
    try:
        with sigterm_interrupts():
            if tasks or upstream or policy:
                doc = _one_round(console, tasks, harness, upstream, policy, group_size, groups_per_task, concurrency,
                                 max_turns, max_tokens, port, store)
            else:
                recipe = GrpoRecipe(rounds=rounds, tasks_per_round=tasks_per_round, group_size=group_size,
                                    signal_groups=signal_groups, max_draws=max_draws,
                                    temperature=temperature, lr=grpo_lr, epochs=grpo_epochs,
                                    batch_size=grpo_batch_size or None, loss_agg=loss_agg, clip_high=clip_high,
                                    negative_weight=negative_weight, norm_by_std=not dr_grpo, keep_optimizer=not fresh_optimizer,
                                    lora_rank=lora_rank, call_cost=call_cost, success_only=success_only,
                                    train_layers=train_layers,
                                    sft_anchor=sft_anchor, anchor_batch_size=anchor_batch_size, kl_coef=kl_coef)
                doc = _loop(console, families=tuple(f.strip() for f in families.split(",") if f.strip()),
                            train_tasks=train_tasks, demo_tasks=demo_tasks, demo_mix=parse_mix(demo_mix),
                            demo_min_steps=demo_min_steps, heldout_tasks=heldout_tasks, seed=seed,
                            eval_samples=eval_samples, careful=careful,
                            teacher=teacher, sft_epochs=sft_epochs, sft_stage_epochs=sft_stage_epochs,
                            sft_val_tasks=sft_val_tasks, sft_train_layers=train_layers, recipe=recipe, control=control,
                            concurrency=concurrency, max_turns=max_turns, max_tokens=max_tokens, port=port,
                            store=store)
    except KeyboardInterrupt:
        console.print("[yellow]cancelled[/]")
        raise typer.Exit(130) from None
    except errors as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    print(json.dumps(doc))


def _loop(console, **opts) -> dict:
    from forge_store import get_settings
    from learner import print_comparison

    from .loop import LearningLoop, LoopConfig
    from .loop_report import print_final, summary_json
    from .scoreboard import print_scoreboard

    t0 = time.monotonic()
    settings = get_settings()
    cfg = LoopConfig(out=settings.home / "demo", vllm_cache=_vllm_cache(), **opts)
    loop = LearningLoop(cfg, console)
    report = loop.run()
    print_scoreboard(console, report.rows, report.phases)
    from forge_store import open_store

    with open_store(cfg.store, settings=settings) as store:
        doc = summary_json(report, t0, store=store, recipe=cfg.recipe.as_dict())
        doc["sft"] = {"epochs": cfg.sft_epochs, "stage_epochs": cfg.sft_stage_epochs, "lr": cfg.sft_lr,
                      "val_tasks": cfg.sft_val_tasks if cfg.sft_stage_epochs else 0,
                      "train_layers": cfg.sft_train_layers}
        doc["teacher"] = {"careful": cfg.careful, "model": cfg.teacher or "scripted",
                          "demonstrations": shares(cfg.demo_tasks, cfg.families, cfg.demo_mix),
                          "demo_min_steps": cfg.demo_min_steps}
        if doc["rubrics_sft_to_final"]:
            from learner import Difference

            diffs = [Difference(**{**d, "ci95": tuple(d["ci95"]) if d["ci95"] else None})
                     for d in doc["rubrics_sft_to_final"]]
            print_comparison(console, f"What GRPO changed: {doc['roles']['final']} (final) against "
                             f"{doc['roles']['sft']} (SFT) on the held-out tasks, paired by task", diffs, "SFT",
                             "final")
    for note in report.notes:
        console.print(f"[yellow]note:[/] {note}")
    console.print(f"success on held-out tasks: base {_pct(doc['success_base'])} -> SFT {_pct(doc['success_sft'])} -> "
                  f"final {_pct(doc['success_final'])} ({doc['final_version']})"
                  + (f"; SFT extended (control) {_pct(doc['success_sft_extended'])}"
                     if doc.get("success_sft_extended") is not None else "")
                  + f"; policy switches p50 {doc['switch_s_p50']} s; {doc['minutes']} min in all")
    print_final(console, doc)
    if cfg.teacher is None:
        console.print("[yellow]the teacher was SCRIPTED[/]: it replays each task's reference solution, knowing what "
                      "the workspace hides; it never reads back, errs or searches (examples/generated-tasks.md)")
    greedy = [doc["eval_runs"].get(doc["roles"].get(r)) for r in ("sft", "final")]
    runs = "".join(f" --run {r}" for r in greedy if r) if doc.get("sampled") else ""   # not the sampled runs too
    console.print("[bold]next[/] (from the project's venv, .venv/bin):\n"
                  f"  openforge lineage {doc['final_version']}   # the chain base -> SFT -> GRPO, with shards\n"
                  "  openforge dashboard                          # success by version along the chain, trajectories\n"
                  f"  openforge analyze --compare {doc['roles'].get('sft')} {doc['final_version']}{runs}   # every "
                  "rubric, paired by task\n"
                  "  python bench/learning_curve.py --seeds 3     # the same loop over three seeds, pooled")
    return doc


def _one_round(console, tasks, harness, upstream, policy, group_size, groups_per_task, concurrency, max_turns,
               max_tokens, port, store) -> dict:
    from .demo_round import DemoConfig, DemoError, run_demo

    root = Path(__file__).resolve().parents[1] / "examples" / "tasks"
    cfg = DemoConfig(tasks=tasks or root, harness=harness, upstream=upstream, policy=policy, group_size=group_size,
                     groups_per_task=groups_per_task, concurrency=concurrency, max_turns=max_turns,
                     max_tokens=max_tokens, port=port, store=store, task_names=() if tasks else DemoConfig.task_names,
                     vllm_cache=_vllm_cache())
    try:
        rep = run_demo(cfg, console)
    except DemoError as exc:
        raise RuntimeError(str(exc)) from None
    return {"run_id": rep.run_id, "policy_version": rep.policy_version, "rollouts": rep.rollouts,
            "outcomes": rep.outcomes, "success_rate": rep.success_rate, "calls": rep.calls,
            "token_exact_calls": rep.token_exact_calls, "samples": rep.samples, "shard": rep.shard,
            "manifest_verified": rep.manifest_verified, "timings": rep.timings}


def _pct(v) -> str:
    return "-" if v is None else f"{v:.0%}"


def _vllm_cache() -> str | None:
    from forge_store import get_settings

    cache = get_settings().vllm_cpu_cache
    return str(cache) if cache else None
