"""bench/pass_at_k.py's arithmetic: the k it reports and the curves from per-task counts (the unbiased pass@k and
pass^k, by family too); arguments that cannot run are refused before any engine starts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("pass_at_k", Path(__file__).parents[1] / "bench" / "pass_at_k.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_ks_double_up_to_the_largest_and_include_it():
    assert bench.ks(16) == [1, 2, 4, 8, 16]
    assert bench.ks(12) == [1, 2, 4, 8, 12]
    assert bench.ks(2) == [1, 2]


def test_curves_from_counts():
    # task a: 4 of 4 pass; b: 1 of 4; c: 0 of 4
    c = bench.curves({"a": (4, 4, "files"), "b": (4, 1, "check"), "c": (4, 0, "check")}, 4)
    assert c["pass_at"][1] == pytest.approx((1 + 0.25 + 0) / 3)
    assert c["pass_at"][4] == pytest.approx(2 / 3)            # a and b were solved at least once
    assert c["pass_at"][2] == pytest.approx((1 + 0.5 + 0) / 3)  # b: 1 - C(3,2)/C(4,2) = 0.5
    assert c["pass_hat"][4] == pytest.approx(1 / 3)           # only a always
    assert c["by_family"]["check"] == {"pass_at_1": pytest.approx(0.125), "pass_at_4": pytest.approx(0.5)}


def test_refuses_k_below_two_and_a_version_without_a_checkpoint(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--from", str(tmp_path), "--seed", "1", "--version", "v", "--k", "1"])
    assert "pass@k needs 2 or more" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--from", str(tmp_path), "--seed", "1", "--version", "v"])
    assert f"no checkpoint {tmp_path / 'checkpoints' / 'v'}" in capsys.readouterr().err
