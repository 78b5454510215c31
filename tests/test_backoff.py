"""``forge_store.Backoff``: the delays every retry loop waits (the store's writers, the drain supervisor, the
Kubernetes API client)."""

from __future__ import annotations

import random

import pytest

from forge_store import Backoff


def test_delays_double_up_to_the_cap_and_start_over_after_progress():
    delays = Backoff(0.05, 0.3)
    assert [delays.next() for _ in range(5)] == [0.05, 0.1, 0.2, 0.3, 0.3]
    delays.reset()
    assert delays.next() == 0.05
    assert Backoff(2.0, 0.5).next() == 0.5  # a first delay past the cap is the cap


def test_jittered_delays_stay_in_the_upper_half_of_their_step_and_respect_a_servers_floor():
    delays = Backoff(1.0, 8.0, jitter=True, rng=random.Random(7))
    got = [delays.next() for _ in range(5)]
    for d, step in zip(got, (1, 2, 4, 8, 8)):
        assert step / 2 <= d <= step
    assert len(set(got)) == 5
    assert Backoff(1.0, 8.0, jitter=True).next(floor=3.0) == 3.0  # Retry-After: 3


@pytest.mark.parametrize("first, cap", [(0, 1), (1, 0), (-1, 5)])
def test_a_delay_that_is_not_positive_is_refused(first, cap):
    with pytest.raises(ValueError, match=rf"Backoff\(first={first}, cap={cap}\).*must be > 0"):
        Backoff(first, cap)
