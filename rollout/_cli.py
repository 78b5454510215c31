"""``openforge tasks``: generate task sets from a family of templates (``generate``), list the families, and list,
diff and validate task versions (``rollout._tasksets``); ``synth`` is added by the roof (``openforge.tasks_cli``).

Declared as an entry point in ``pyproject.toml``; the root command discovers it. Errors are one red line (value,
rule, fix) and exit code 2.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import typer
from rich.console import Console

from ._taskgen import TaskGenError, plan, task_families, write
from ._tasksets import diff_command, list_command, validate_command

tasks_app = typer.Typer(help="Task sets as versioned data: generate them from families of templates, list, diff "
                        "and validate their versions.", no_args_is_help=True)
tasks_app.command("list")(list_command)
tasks_app.command("diff")(diff_command)
tasks_app.command("validate")(validate_command)
console = Console(soft_wrap=True)
err = Console(stderr=True)


@tasks_app.command("generate")
def generate_command(
    family: str = typer.Option("files", "--family", help="Task family (see `openforge tasks families`)."),
    train: int = typer.Option(0, "--train", help="Tasks in the train split."),
    heldout: int = typer.Option(0, "--heldout", help="Tasks in the held-out split (disjoint instructions)."),
    seed: int = typer.Option(0, "--seed", help="Generation seed: the same seed gives the same bytes."),
    difficulty: str = typer.Option("", "--difficulty", help="Steps per task, cycled evenly, e.g. 1 or 1,2,3 "
                                   "(default: the family's own: 1,2,3; plan 3,4)."),
    careful: float = typer.Option(0.0, "--careful", help="Share of steps (check, recover) whose reference solution "
                                  "looks first or recovers from the error instead of knowing what the step hides."),
    out: Path = typer.Option(..., "--out", help="Folder to write (created; train/ and heldout/ inside)."),
    json_out: bool = typer.Option(False, "--json", help="Print what was written as JSON on stdout."),
) -> None:
    """Write generated task folders into OUT/train and OUT/heldout, with OUT/taskgen.json as the manifest."""
    try:
        difficulties = tuple(int(x) for x in difficulty.split(",") if x.strip()) or None
    except ValueError:
        _fail(f"--difficulty {difficulty!r}: pass step counts separated by commas, e.g. 1,2,3")
    try:
        p = plan(family, train=train, heldout=heldout, seed=seed, difficulties=difficulties, careful=careful)
        written = write(p, out)
    except (TaskGenError, OSError) as exc:
        _fail(exc)
    if json_out:
        print(json.dumps({"out": str(out), "written": written, "tasks": p.tasks}))
        return
    verb = "wrote" if written else "unchanged (already generated):"
    for split in ("train", "heldout"):
        tasks = [t for t in p.tasks if t["split"] == split]
        if tasks:
            mix = Counter(t["difficulty"] for t in tasks)
            steps = ", ".join(f"{n} x {d} step{'s' if d > 1 else ''}" for d, n in sorted(mix.items()))
            console.print(f"{verb} {len(tasks)} {split} tasks in {out / split} ({steps})", highlight=False)
    console.print(f"manifest: {out / 'taskgen.json'}; run them with: openforge run {out / 'train'} --harness react "
                  f"--upstream URL", highlight=False)


@tasks_app.command("families")
def families_command(json_out: bool = typer.Option(False, "--json", help="Print the families as JSON "
                                                     "(family -> templates) on stdout.")) -> None:
    """List the task families and their templates."""
    if json_out:
        print(json.dumps(task_families()))
        return
    for name, templates in task_families().items():
        console.print(f"{name}: {', '.join(templates)}", highlight=False)


def _fail(exc: object) -> None:
    err.print(f"[bold red]error:[/] {exc}", highlight=False)
    raise typer.Exit(2)
