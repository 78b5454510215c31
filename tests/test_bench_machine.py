"""bench/machine.py: the machine a benchmark's JSON records, read from /proc's text (no torch), and the warning a
learning run gets on a CPU without AVX-512 (where the train step computes in float32)."""

from __future__ import annotations

from bench.machine import describe, parse_cpuinfo, training_note

_BLOCK = """processor\t: {n}
vendor_id\t: {vendor}
cpu family\t: {family}
model\t\t: {model}
model name\t: {name}
flags\t\t: fpu sse2 {flags}

"""


def _cpuinfo(name: str, flags: str, vendor: str = "AuthenticAMD", family: int = 25, model: int = 1) -> str:
    # two processors; the second with other flags: only the first block counts
    return (_BLOCK.format(n=0, vendor=vendor, family=family, model=model, name=name, flags=flags)
            + _BLOCK.format(n=1, vendor=vendor, family=family, model=model, name="other", flags="amx_bf16"))


def test_an_avx2_only_cpu_trains_in_float32_and_the_run_is_warned():
    m = describe(_cpuinfo("AMD EPYC", "avx avx2 fma"), "MemTotal:       24641364 kB\nMemFree: 1 kB\n")
    assert m["cpu"] == "AMD EPYC" and m["cpu_id"] == "AuthenticAMD 25/1", m
    assert m["simd"] == ["avx2"] and m["bf16_hw"] is False and m["mem_gib"] == 23.5, m
    note = training_note(m)
    assert note and "no AVX-512, so no bfloat16" in note and "AMD EPYC; avx2" in note, note
    assert training_note(describe(_cpuinfo("Intel(R) Core(TM) Ultra", "avx2 avx_ne_convert"), "")) is None


def test_a_cpu_with_avx512_needs_no_warning_and_bf16_hardware_is_told_apart():
    for flags, simd, hw in (("avx2 avx512f avx512bw", ["avx2", "avx512f"], False),
                            ("avx2 avx512f avx512_bf16", ["avx2", "avx512f", "avx512_bf16"], True),
                            ("amx_bf16 avx512f avx2 amx_tile", ["avx2", "avx512f", "amx_bf16"], True)):
        m = describe(_cpuinfo("Intel(R) Xeon(R)", flags, vendor="GenuineIntel", family=6, model=143), "")
        assert m["simd"] == simd and m["bf16_hw"] is hw and m["mem_gib"] is None, m
        assert m["cpu_id"] == "GenuineIntel 6/143" and training_note(m) is None


def test_a_machine_without_proc_files_is_described_without_guessing():
    model, ident, flags = parse_cpuinfo("")
    assert (model, ident, flags) == (None, None, set())
    m = describe("", "")
    assert m["simd"] == [] and m["bf16_hw"] is False and m["cpu_id"] is None and training_note(m) is None
    assert m["cpus"] >= 1 and m["python"].count(".") == 2
