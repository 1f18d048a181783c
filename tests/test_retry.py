from __future__ import annotations

import random
from datetime import timedelta

import pytest

from oncebox import ConfigurationError, Permanent, Retry, RetryLater


def test_backoff_is_full_jitter_below_a_capped_exponential():
    policy = Retry(
        max_attempts=10, base_delay=timedelta(seconds=2), max_delay=timedelta(seconds=60)
    )
    rng = random.Random(7)
    for attempt, cap in [(1, 2), (2, 4), (3, 8), (5, 32), (6, 60), (9, 60)]:
        assert policy.backoff_cap(attempt) == timedelta(seconds=cap)
        delays = [policy.backoff(attempt, rng) for _ in range(300)]
        assert all(timedelta(0) <= d <= timedelta(seconds=cap) for d in delays)
        # full jitter spreads over the range, not clustered at the cap
        assert min(delays) < timedelta(seconds=cap * 0.2)
        assert max(delays) > timedelta(seconds=cap * 0.8)


def test_classification_order():
    policy = Retry(
        permanent_on=(KeyError,),
        retry_on=(ConnectionError, KeyError),
        delay_for={TimeoutError: timedelta(seconds=30)},
    )
    rng = random.Random(1)
    assert not policy.decide(Permanent("no"), 1, 4, rng).retry
    assert not policy.decide(KeyError("k"), 1, 4, rng).retry
    assert not policy.decide(ValueError("v"), 1, 4, rng).retry  # not in retry_on
    assert policy.decide(ConnectionError("c"), 1, 4, rng).retry
    later = policy.decide(RetryLater("wait", delay=timedelta(seconds=9)), 1, 4, rng)
    assert later.retry and later.delay == timedelta(seconds=9)
    assert not policy.decide(ConnectionError("c"), 5, 0, rng).retry  # no attempts left
    plain = Retry(delay_for={TimeoutError: timedelta(seconds=30)})
    assert plain.decide(TimeoutError(), 1, 4, rng).delay == timedelta(seconds=30)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"base_delay": timedelta(seconds=-1)},
        {"base_delay": timedelta(seconds=10), "max_delay": timedelta(seconds=1)},
        {"max_age": timedelta(0)},
    ],
)
def test_out_of_range_policies_are_refused(kwargs):
    with pytest.raises(ConfigurationError):
        Retry(**kwargs)
