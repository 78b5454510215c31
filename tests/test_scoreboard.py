"""The loop's scoreboard: Wilson intervals and the difference of two success rates."""

from __future__ import annotations

import pytest

from openforge.scoreboard import Rate, difference, wilson


@pytest.mark.parametrize("k,n,lo,hi", [(0, 20, 0.0, 0.1611), (20, 20, 0.8389, 1.0), (10, 20, 0.2993, 0.7007),
                                       (1, 4, 0.0456, 0.6994)])
def test_wilson_matches_the_textbook_values(k, n, lo, hi):
    got = wilson(k, n)
    assert got[0] == pytest.approx(lo, abs=1e-4) and got[1] == pytest.approx(hi, abs=1e-4)


def test_no_data_is_the_whole_interval_and_no_rate():
    assert wilson(0, 0) == (0.0, 1.0)
    r = Rate()
    assert r.value is None and r.text() == "-"
    assert difference(Rate(1, 2), Rate()) == (None, None)


def test_difference_interval_contains_the_difference_and_excludes_zero_only_when_clear():
    d, (lo, hi) = difference(Rate(18, 20), Rate(1, 20))
    assert d == pytest.approx(0.85) and lo <= d <= hi and lo > 0.5
    d, (lo, hi) = difference(Rate(6, 20), Rate(5, 20))
    assert lo < 0 < hi
