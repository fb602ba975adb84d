"""Seeded Poisson arrivals and run bounds."""

import statistics

import pytest

from hybridflow.loadgen.config import MAX_DURATION_S, MAX_REQUESTS, LoadgenConfig
from hybridflow.loadgen.schedule import RunBounds, poisson_arrivals


def test_same_seed_same_schedule_other_seed_other_schedule():
    bounds = RunBounds(max_duration_s=10.0, max_requests=1000)
    a = list(poisson_arrivals(5.0, 7, bounds))
    assert a == list(poisson_arrivals(5.0, 7, bounds))
    assert a != list(poisson_arrivals(5.0, 8, bounds))


def test_mean_rate_and_exponential_gaps_within_tolerance():
    rate, duration = 50.0, 200.0
    times = list(poisson_arrivals(rate, 0, RunBounds(duration, 10**6)))
    # Count ~ Poisson(10000): sd 100 (1%); 3% is 3 sd.
    assert abs(len(times) / duration - rate) / rate < 0.03
    gaps = [b - a for a, b in zip([0.0, *times], times)]
    assert abs(statistics.fmean(gaps) - 1 / rate) * rate < 0.03
    # Exponential gaps: standard deviation equals the mean.
    assert abs(statistics.pstdev(gaps) / statistics.fmean(gaps) - 1.0) < 0.05


def test_duration_bound_ends_the_schedule():
    times = list(poisson_arrivals(100.0, 1, RunBounds(max_duration_s=2.0, max_requests=10**6)))
    assert times == sorted(times)
    assert 0.0 < times[0] and times[-1] < 2.0
    assert 150 < len(times) < 250


def test_request_bound_ends_the_schedule():
    times = list(poisson_arrivals(1000.0, 1, RunBounds(max_duration_s=3600.0, max_requests=17)))
    assert len(times) == 17


def test_bounds_always_finite_even_when_one_is_missing():
    only_requests = LoadgenConfig(address="127.0.0.1:1", rate=1.0, num_requests=5)
    assert only_requests.max_duration_s == MAX_DURATION_S
    assert only_requests.max_requests == 5
    only_duration = LoadgenConfig(address="127.0.0.1:1", rate=1.0, duration_s=2.0)
    assert only_duration.max_requests == MAX_REQUESTS
    # A huge rate with only a duration still stops at the request cap.
    bounds = RunBounds(only_duration.max_duration_s, 50)
    assert len(list(poisson_arrivals(1e5, 0, bounds))) == 50


def test_exhausted_at_either_bound():
    bounds = RunBounds(max_duration_s=1.0, max_requests=3)
    assert not bounds.exhausted(0.99, 2)
    assert bounds.exhausted(1.0, 0)
    assert bounds.exhausted(0.0, 3)


@pytest.mark.parametrize(
    ("duration", "requests"), [(float("inf"), 1), (0.0, 1), (1.0, 0), (float("nan"), 1)]
)
def test_unbounded_or_empty_bounds_are_rejected(duration, requests):
    with pytest.raises(ValueError, match="max_"):
        RunBounds(duration, requests)


def test_rate_must_be_positive():
    with pytest.raises(ValueError, match="rate"):
        list(poisson_arrivals(0.0, 0, RunBounds(1.0, 1)))
