"""What machine a benchmark ran on, for its JSON: figures from an AVX2-only CPU and from one with AMX differ by
several times (the train step runs in float32 where the CPU has no AVX-512), and a figure without its machine
cannot be compared with the next one.

``describe()`` reads Linux's ``/proc/cpuinfo`` and ``/proc/meminfo`` (elsewhere: what ``platform`` says, the rest
None). ``bf16_hw``: the CPU has bfloat16 instructions (AVX-512 BF16 or AMX). The train step's own choice
(``learner/_step_choices.resolve_precision``) asks oneDNN through torch, which on x86 also counts plain AVX-512
(BW/VL/DQ), and recent versions AVX-NE-CONVERT, as bfloat16 support; a CPU with neither trains in float32 (on this
AVX2-only kind of machine the probe says False). The warning keys on that, from the flags, so that no benchmark has
to import torch.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

# the flags that decide how fast the train step and the engine run on a CPU, in the order a reader compares them
SIMD = ("avx2", "avx_ne_convert", "avx512f", "avx512_bf16", "amx_bf16")


def parse_cpuinfo(text: str) -> tuple[str | None, str | None, set[str]]:
    """(the first processor's model name, its vendor, family and model numbers, its flags) from ``/proc/cpuinfo``'s
    text. A virtual machine may name its CPU only "AMD EPYC": the numbers tell the generation (25/1: Milan)."""
    first: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if first:   # a blank line ends the first processor's block
                break
            continue
        first.setdefault(key.strip(), value.strip())
    ident = (f"{first.get('vendor_id', '?')} {first['cpu family']}/{first['model']}"
             if "cpu family" in first and "model" in first else None)
    return first.get("model name"), ident, set(first.get("flags", "").split())


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def describe(cpuinfo: str | None = None, meminfo: str | None = None) -> dict:
    """The machine as a benchmark's JSON records it (``cpuinfo`` / ``meminfo``: the files' text; read when None)."""
    model, ident, flags = parse_cpuinfo(_read("/proc/cpuinfo") if cpuinfo is None else cpuinfo)
    mem_kib = next((int(line.split()[1]) for line in (_read("/proc/meminfo") if meminfo is None else meminfo)
                    .splitlines() if line.startswith("MemTotal:")), None)
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpu": model or platform.processor() or None,
        "cpu_id": ident,
        "cpus": os.cpu_count(),
        "simd": [f for f in SIMD if f in flags],
        "bf16_hw": bool(flags & {"avx512_bf16", "amx_bf16"}),
        "mem_gib": round(mem_kib / 2**20, 1) if mem_kib else None,
        "load_avg": load,   # at the start: a busy machine's figures measure its neighbours too
        "python": platform.python_version(),
    }


def training_note(machine: dict) -> str | None:
    """A warning for a learning run on a CPU without AVX-512 or AVX-NE-CONVERT (so without bfloat16 in the train
    step), None otherwise (and where the flags are unknown)."""
    if {"avx512f", "avx_ne_convert"} & set(machine["simd"]) or not machine["simd"]:
        return None
    return (f"this CPU ({machine['cpu']}; {', '.join(machine['simd'])}) has no AVX-512, so no bfloat16: the train "
            "steps run in float32; on such a CPU the measured recipe's SFT took 46.5 s a step against about 13 s "
            "with AMX (README, 2026-12-07: 93 minutes of SFT), so one seed takes hours here")
