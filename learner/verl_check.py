"""Cross-check against veRL itself, run INSIDE veRL's own environment (not the project venv).

Self-contained on purpose: stdlib + torch + pyarrow + pydantic + verl only; nothing from the project is imported.
Run it BY PATH, not ``-m learner.verl_check``: ``learner/__init__.py`` imports the whole learner (forge_store, ...),
which the veRL venv does not have.

    python3.11 learner/verl_check.py setup          # build the venv (idempotent; `make verl-env`)
    <venv>/bin/python learner/verl_check.py compare FILE  # compare FILE's advantages/samples with veRL's
    <venv>/bin/python learner/verl_check.py policy-loss   # the CPU step's policy loss against veRL's vanilla one
    <venv>/bin/python learner/verl_check.py rollout-corr FILE  # an export's rollout_is_weights against veRL's
    python3.11 learner/verl_check.py python         # print the venv's python

``compare`` reads a JSON file written by tests/slow/test_verl_crosscheck.py:

    {"eps": 1e-6,
     "cases": [{"name", "norm_by_std", "singleton", "uids": [...], "rewards": [...], "response_lengths": [...],
                "ours": [...], "expect_equal": bool}],
     "shards": ["/path/trajectories-*.parquet", ...]}

and prints one JSON report on stdout; exit 0 only when every ``expect_equal`` case agrees with veRL to ``tol``
and every exported row constructs veRL's ``AgentLoopOutput``.

``setup`` also installs this checkout into the venv (``pip install --no-deps -e``, then the project's base and proxy
requirements where veRL's own packages do not already satisfy them, and TransferQueue, which veRL's V1 trainer
imports), so that the roof's ``openforge`` agent loop runs there: ``<venv>/bin/python -m openforge.verl_agent_check
FILE`` (tests/slow/test_verl_agent_loop.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

VERL_VERSION = os.environ.get("OPENFORGE_VERL_VERSION", "0.9.1")
# A CPU torch that veRL's base requirements accept (veRL itself pins torch only in its engine extras). When pip
# can find it locally (find-links) it saves the ~6 GB CUDA download; otherwise pip falls back to what verl pulls.
TORCH_VERSION = os.environ.get("OPENFORGE_VERL_TORCH", "2.13.0")
CACHE = Path(os.environ.get("OPENFORGE_VERL_DIR", Path.home() / ".cache" / "openforge" / "verl"))
VENV = CACHE / "venv"
MARKER = VENV / f".installed-verl-{VERL_VERSION}"
TOL = 1e-5
AGENT_LOOP_DEPS = ("cachetools", "fastapi", "uvicorn")
# veRL's V1 trainer (trainer.use_v1, the one that takes several outputs per session) imports TransferQueue, which
# verl lists only in its [verl-core] extra.
V1_DEPS = ("TransferQueue>=0.1.10", "pyzmq", "msgspec")
ROOT = Path(__file__).resolve().parents[1]


def _log(msg: str) -> None:
    print(f"[verl-env] {msg}", file=sys.stderr, flush=True)


def _pip(*args: str) -> None:
    cmd = [str(VENV / "bin" / "python"), "-m", "pip", *args]
    _log(" ".join(cmd))
    subprocess.run(cmd, check=True)


def setup() -> Path:
    """Create ``VENV`` with verl==VERL_VERSION; a no-op when the marker (written last) is there."""
    if MARKER.exists():
        _log(f"{VENV} ready (verl {VERL_VERSION})")
        return VENV
    t0 = time.monotonic()
    if VENV.exists():
        _log(f"removing incomplete {VENV}")
        shutil.rmtree(VENV)
    CACHE.mkdir(parents=True, exist_ok=True)
    python = os.environ.get("OPENFORGE_VERL_PYTHON") or shutil.which("python3.11") or sys.executable
    _log(f"creating {VENV} with {python}")
    subprocess.run([python, "-m", "venv", str(VENV)], check=True)
    _pip("install", "--quiet", "--upgrade", "pip")
    try:  # CPU torch first, when a local wheel / index has it
        _pip("install", "--quiet", f"torch=={TORCH_VERSION}")
    except subprocess.CalledProcessError:
        _log(f"torch=={TORCH_VERSION} not installable here; verl will pull its own torch")
    _log(f"installing verl=={VERL_VERSION} (a few minutes)")
    # verl.experimental.agent_loop imports cachetools, fastapi and uvicorn, which verl lists only in its
    # [verl-core] extra (that extra also pulls TransferQueue, torchcodec, nvtx, ...; not needed here).
    _pip("install", "--quiet", f"verl=={VERL_VERSION}", *AGENT_LOOP_DEPS)
    subprocess.run([str(VENV / "bin" / "python"), "-c",
                    ("import torch, verl, pyarrow; "
                    "from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage; "
                    "from verl.experimental.agent_loop.agent_loop import AgentLoopOutput; "
                    "print('verl', verl.__version__, 'torch', torch.__version__)")], check=True)
    MARKER.write_text(f"verl=={VERL_VERSION}\n")
    _log(f"done in {time.monotonic() - t0:.0f}s")
    return VENV


def _project_requirements() -> list[str]:
    """The project's base requirements and its ``proxy`` extra (the loop's trainer side serves the proxy)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["proxy"]]


def install_project() -> Path:
    """This checkout in the venv, editable; what it needs that veRL does not bring; a no-op when done already."""
    import hashlib

    specs = [*_project_requirements(), *V1_DEPS]
    marker = VENV / f".installed-openforge-{hashlib.sha256(json.dumps([str(ROOT), specs]).encode()).hexdigest()[:12]}"
    if marker.exists():
        _log(f"openforge already installed in {VENV}")
        return VENV
    # pip's default upgrade strategy (only-if-needed) leaves every package veRL brought that satisfies a spec.
    _pip("install", "--quiet", *specs)
    _pip("install", "--quiet", "--no-deps", "-e", str(ROOT))
    subprocess.run([str(VENV / "bin" / "python"), "-c",
                    "import forge_store, rollout, learner, proxy, transfer_queue, verl; "
                    "print('the project in verl', verl.__version__)"], check=True, cwd="/")
    marker.write_text("\n".join(specs) + "\n")
    return VENV


# ---------------------------------------------------------------------------------------------------------------
# compare (runs inside the veRL venv)


def _verl_advantages(case: dict, eps: float, dtype: str = "float32") -> list[float]:
    import numpy as np
    import torch
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    lengths = case["response_lengths"]
    bsz, width = len(lengths), max(lengths)
    rewards = torch.zeros(bsz, width, dtype=getattr(torch, dtype))
    mask = torch.zeros(bsz, width, dtype=getattr(torch, dtype))
    for i, (r, n) in enumerate(zip(case["rewards"], lengths)):
        mask[i, :n] = 1.0
        rewards[i, n - 1] = r  # outcome reward at the last response token
    index = np.array(case["uids"], dtype=object)
    adv, _ret = compute_grpo_outcome_advantage(
        token_level_rewards=rewards, response_mask=mask, index=index, epsilon=eps,
        norm_adv_by_std_in_grpo=case["norm_by_std"])
    out = []
    for i, n in enumerate(lengths):
        row = adv[i, :n]
        # veRL broadcasts the scalar advantage over the response mask; check that, then keep the scalar.
        past = adv[i, n:]
        if not torch.equal(row, row[0].expand_as(row)) or (past.numel() and past.abs().max().item() != 0.0):
            raise AssertionError(f"row {i}: advantage not constant over the response mask / nonzero past it")
        out.append(float(row[0]))
    return out


def _agent_loop_outputs(shards: list[str]) -> dict:
    import inspect

    import pyarrow.parquet as pq
    from pydantic import ValidationError
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopMetrics,
        AgentLoopOutput,
    )

    fields = set(AgentLoopOutput.model_fields)
    required = sorted(n for n, f in AgentLoopOutput.model_fields.items() if f.is_required())
    built, problems, columns = 0, [], set()
    for shard in shards:
        table = pq.read_table(shard)
        columns |= set(table.column_names)
        for row in table.to_pylist():
            kw = {k: row[k] for k in fields if k in row and k != "metrics" and row[k] is not None}
            kw["metrics"] = AgentLoopMetrics()
            try:
                out = AgentLoopOutput(**kw)
            except ValidationError as exc:
                problems.append(f"{Path(shard).name}: {type(exc).__name__}: {exc}")
                continue
            try:  # the tensors veRL's agent loop hands on (prompts, responses, response_mask, rollout_log_probs)
                tensors = out.as_dict()
            except (TypeError, ValueError, RuntimeError) as exc:
                problems.append(f"AgentLoopOutput.as_dict: {type(exc).__name__}: {exc}")
                tensors = {}
            if tensors and tensors["responses"].shape != tensors["response_mask"].shape:
                problems.append("as_dict: responses / response_mask shapes differ")
            n = len(out.response_ids)
            if len(out.response_mask) != n:
                problems.append(f"response_mask length {len(out.response_mask)} != response_ids {n}")
            if out.response_logprobs is not None and len(out.response_logprobs) != n:
                problems.append(f"response_logprobs length {len(out.response_logprobs)} != response_ids {n}")
            built += 1
    return {"rows": built, "problems": problems, "required_fields": required,
            "agent_loop_output_fields": sorted(fields), "missing_from_export": sorted(fields - columns - {"metrics"}),
            "source": inspect.getsourcefile(AgentLoopOutput)}


def compare(path: str) -> int:
    import torch
    import verl

    spec = json.loads(Path(path).read_text())
    eps = spec.get("eps", 1e-6)
    report = {"verl": verl.__version__, "torch": torch.__version__, "tol": TOL, "cases": [], "ok": True}
    for case in spec["cases"]:
        # veRL trains with float32 rewards; float64 is the same function on exact-ish inputs. In float32 an all-equal
        # group can get a nonzero mean residual (e.g. seven 0.3f average to 0.3f + 1 ulp) that veRL divides by
        # (std + eps) ~ 1e-6: small same-sign advantages where ours are exactly 0. Those groups are compared in
        # float64 and their float32 noise is reported, not failed.
        flat = set(case.get("all_equal_uids", []))
        entry = {"name": case["name"], "n": len(case["ours"]), "expect_equal": case["expect_equal"]}
        for dtype in ("float32", "float64"):
            theirs = _verl_advantages(case, eps, dtype)
            diffs = [abs(a - b) for a, b, u in zip(case["ours"], theirs, case["uids"])
                     if dtype == "float64" or u not in flat]
            noise = [abs(b) for b, u in zip(theirs, case["uids"]) if u in flat]
            entry[dtype] = {"max_abs_diff": max(diffs, default=0.0), "equal": max(diffs, default=0.0) <= TOL,
                            "all_equal_groups_max_abs_adv": max(noise, default=0.0), "verl": theirs}
        entry["equal"] = entry["float32"]["equal"] and entry["float64"]["equal"]
        entry["max_abs_diff"] = max(entry["float32"]["max_abs_diff"], entry["float64"]["max_abs_diff"])
        entry["ours"] = case["ours"]
        if case["expect_equal"] and not entry["equal"]:
            report["ok"] = False
        report["cases"].append(entry)
    if spec.get("shards"):
        alo = _agent_loop_outputs(spec["shards"])
        report["agent_loop_output"] = alo
        if alo["problems"] or alo["rows"] == 0:
            report["ok"] = False
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


def _our_losses():
    """learner/_step_losses.py loaded by path (the project package is not importable here without its deps)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_step_losses", ROOT / "learner" / "_step_losses.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def policy_loss_check(tol: float = 1e-6) -> int:
    """The CPU step's policy loss (learner/_step_losses.py) against veRL's ``get_policy_loss_fn("vanilla")`` on the
    same seeded tensors, for every ``loss_agg_mode``, symmetric and clip-higher ranges, with and without
    ``rollout_is_weights``: the loss and its gradient with respect to the log-probabilities must agree, and two
    micro-batches with the mini-batch's totals must add up to the whole mini-batch's loss."""
    import torch
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config import ActorConfig

    ours = _our_losses()
    verl_loss = get_policy_loss_fn("vanilla")
    gen = torch.Generator().manual_seed(5)
    bs, width = 6, 9
    old = -torch.rand(bs, width, generator=gen, dtype=torch.float64) * 3
    new = old + (torch.rand(bs, width, generator=gen, dtype=torch.float64) - 0.5) * 0.8   # ratios both sides of clip
    new[:, :2] = old[:, :2] + 1.5                  # ratio 4.5: past the dual clip (3) where the advantage is negative
    adv = (torch.randn(bs, 1, generator=gen, dtype=torch.float64) * 1.5).expand(bs, width).contiguous()
    adv[0], adv[1] = -1.3, 0.9
    mask = (torch.rand(bs, width, generator=gen) < 0.7).double()
    mask[2] = 0.0                                   # a sequence with no policy token
    weights = torch.rand(bs, width, generator=gen, dtype=torch.float64) * 2
    report = {"ok": True, "cases": []}
    for mode in ours.LOSS_AGG_MODES:
        for low, high in ((0.2, 0.2), (0.2, 0.28)):
            for w in (None, weights):
                info = {"batch_num_tokens": float(mask.sum()), "global_batch_size": float((mask.sum(-1) > 0).sum()),
                        "loss_scale_factor": width}
                cfg = ActorConfig(strategy="fsdp", clip_ratio=low, clip_ratio_low=low, clip_ratio_high=high,
                                  ppo_micro_batch_size_per_gpu=1, use_dynamic_bsz=False, rollout_n=4,
                                  ppo_mini_batch_size=bs)
                cfg.global_batch_info.update({"dp_size": 1, **info})   # veRL fills it the same way, per step
                lv = new.clone().requires_grad_(True)
                loss_v, _ = verl_loss(old, lv, adv, mask, loss_agg_mode=mode, config=cfg, rollout_is_weights=w)
                loss_v.backward()
                lo = new.clone().requires_grad_(True)
                loss_o, _ = ours.policy_loss(torch, old, lo, adv, mask, mode=mode, clip_low=low, clip_high=high,
                                             clip_c=cfg.clip_ratio_c, rollout_is_weights=w, **info)
                loss_o.backward()
                parts = 0.0
                for rows in (slice(0, 2), slice(2, bs)):   # micro-batches carrying the mini-batch's totals
                    part, _ = ours.policy_loss(torch, old[rows], new[rows], adv[rows], mask[rows], mode=mode,
                                               clip_low=low, clip_high=high, rollout_is_weights=None if w is None
                                               else w[rows], **info)
                    parts += float(part)
                entry = {"mode": mode, "clip": [low, high], "weights": w is not None, "verl": float(loss_v),
                         "ours": float(loss_o), "loss_diff": abs(float(loss_v) - float(loss_o)),
                         "grad_diff": float((lv.grad - lo.grad).abs().max()),
                         "micro_diff": abs(parts - float(loss_o))}
                entry["equal"] = max(entry["loss_diff"], entry["grad_diff"], entry["micro_diff"]) <= tol
                report["ok"] &= entry["equal"]
                report["cases"].append(entry)
    report["kl_cases"] = _kl_cases(torch, ours, old, new, mask, tol)
    report["ok"] &= all(c["equal"] for c in report["kl_cases"])
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


def _kl_cases(torch, ours, ref, new, mask, tol: float) -> list[dict]:
    """Our ``kl_penalty`` against veRL's ``core_algos.kl_penalty`` for every estimator it names, value and gradient,
    and the KL loss the actor adds (aggregated token-mean, as veRL's ``agg_loss`` default)."""
    from verl.trainer.ppo.core_algos import agg_loss, kl_penalty

    cases = []
    for kind in ours.KL_TYPES:
        lv, lo = new.clone().requires_grad_(True), new.clone().requires_grad_(True)
        kv, ko = kl_penalty(lv, ref, kind), ours.kl_penalty(torch, lo, ref, kind)
        loss_v = agg_loss(loss_mat=kv, loss_mask=mask, loss_agg_mode="token-mean")
        loss_o = ours.agg_loss(torch, ko, mask, "token-mean")
        loss_v.backward()
        loss_o.backward()
        entry = {"kind": kind, "value_diff": float((kv - ko).abs().max()), "verl_loss": float(loss_v),
                 "loss_diff": abs(float(loss_v) - float(loss_o)), "grad_diff": float((lv.grad - lo.grad).abs().max())}
        entry["equal"] = max(entry["value_diff"], entry["loss_diff"], entry["grad_diff"]) <= tol
        cases.append(entry)
    return cases


def rollout_corr_check(path: str, tol: float = 1e-5) -> int:
    """An export's ``rollout_is_weights`` against veRL's rollout correction on the same logprobs.

    FILE (JSON): ``{"cases": [{"name", "mode", "cap", "old": [[...]], "rollout": [[...]], "mask": [[...]],
    "ours": [[...]]}]}``: per sample, the trainer's and the engine's logprob and the mask at every response position
    and the weights the export wrote. ``mode`` maps to veRL's settings as the export's manifest says
    (``learner/_rollout_weights.py``: ``verl_settings``); veRL's ``compute_rollout_correction_and_rejection_mask``
    must give our weights to ``tol`` (relative)."""
    import torch
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    ours_mod = importlib_util_load("_rollout_weights", ROOT / "learner" / "_rollout_weights.py")
    report = {"ok": True, "cases": []}
    for case in json.loads(Path(path).read_text())["cases"]:
        settings = ours_mod.verl_settings(case["mode"], case["cap"])
        width = max(len(m) for m in case["mask"])

        def pad(rows):
            return torch.tensor([r + [0.0] * (width - len(r)) for r in rows], dtype=torch.float64)

        old, rollout, mask = pad(case["old"]), pad(case["rollout"]), pad(case["mask"])
        weights, _, _ = compute_rollout_correction_and_rejection_mask(old, rollout, mask, **settings)
        verl_w = weights.batch["rollout_is_weights"]
        ours = pad(case["ours"])
        diff = float(((verl_w - ours).abs() / verl_w.abs().clamp(min=1.0)).max())
        live = mask > 0
        entry = {"name": case["name"], "mode": case["mode"], "cap": case["cap"], "verl_settings": settings,
                 "samples": len(case["mask"]), "tokens": int(live.sum()), "max_rel_diff": diff,
                 "capped": int(((verl_w - case["cap"]).abs() < 1e-12)[live].sum()),
                 "masked": int((verl_w == 0)[live].sum()), "equal": diff <= tol}
        report["ok"] &= entry["equal"]
        report["cases"].append(entry)
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


def importlib_util_load(name: str, path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["setup"]:
        setup()
        install_project()
        return 0
    if argv[:1] == ["compare"] and len(argv) == 2:
        return compare(argv[1])
    if argv[:1] == ["rollout-corr"] and len(argv) == 2:
        return rollout_corr_check(argv[1])
    if argv[:1] == ["policy-loss"]:
        return policy_loss_check()
    if argv[:1] == ["python"]:
        print(VENV / "bin" / "python")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
