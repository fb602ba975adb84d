"""Percentiles and run summaries against hand-computed values."""

import pytest

from hybridflow.loadgen.stats import RequestRecord, percentile, summarize


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),  # rank 1.5
        ([1.0, 2.0, 3.0, 4.0], 90, 3.7),  # rank 2.7 -> 3 + 0.7
        ([1.0, 2.0, 3.0, 4.0], 99, 3.97),  # rank 2.97
        ([4.0, 1.0, 3.0, 2.0], 0, 1.0),  # unsorted input
        ([4.0, 1.0, 3.0, 2.0], 100, 4.0),
        ([7.0], 99, 7.0),
        ([10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 110.0], 90, 100.0),
        ([0.0, 100.0], 99, 99.0),
    ],
)
def test_percentile_hand_computed(values, q, expected):
    assert percentile(values, q) == pytest.approx(expected)


def test_percentile_rejects_empty_and_bad_q():
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)
    with pytest.raises(ValueError, match="q must be"):
        percentile([1.0], 101)


def test_summary_excludes_warmup_and_counts_errors_by_code():
    records = [
        # warm-up: due before 1.0 s, excluded even though it ends later
        RequestRecord(0.5, 0.5, 1.5, "OK", 1.2, num_output_tokens=100, num_items=9),
        RequestRecord(1.0, 1.0, 1.1, "OK", 1.05, num_output_tokens=10, num_items=2),
        RequestRecord(1.5, 1.6, 1.8, "OK", 1.7, num_output_tokens=20, num_items=2),
        RequestRecord(2.0, 2.0, 2.4, "OK", 2.1, num_output_tokens=30, num_items=2),
        RequestRecord(2.5, 2.5, 2.6, "UNAVAILABLE"),
        RequestRecord(2.6, 2.6, 3.0, "DEADLINE_EXCEEDED"),
        RequestRecord(2.7, 2.7, 2.8, "UNAVAILABLE"),
    ]
    s = summarize(records, "open", 4.0, warmup_s=1.0, send_end_s=3.0)
    assert (s.num_sent, s.num_warmup, s.num_ok, s.num_errors) == (6, 1, 3, 3)
    assert s.sent_per_s == pytest.approx(3.0)  # 6 sent between 1.0 and 3.0
    assert s.errors == {"DEADLINE_EXCEEDED": 1, "UNAVAILABLE": 2}
    assert s.window_s == pytest.approx(2.0)  # 1.0 -> last end 3.0
    assert s.requests_per_s == pytest.approx(1.5)
    assert s.output_tokens_per_s == pytest.approx(30.0)
    assert s.items_per_s == pytest.approx(3.0)
    # latencies (from due time): 100, 300, 400 ms
    assert s.latency_ms is not None
    assert s.latency_ms.p50 == pytest.approx(300.0)
    assert s.latency_ms.p90 == pytest.approx(380.0)
    assert s.latency_ms.mean == pytest.approx(800.0 / 3)
    assert s.latency_ms.max == pytest.approx(400.0)
    # first results: 50, 200, 100 ms -> p50 100
    assert s.first_result_ms is not None and s.first_result_ms.p50 == pytest.approx(100.0)
    # send lag over all measured: 0, 100, 0, 0, 0, 0 ms
    assert s.send_lag_ms is not None and s.send_lag_ms.max == pytest.approx(100.0)


def test_send_rate_defaults_to_the_last_send():
    records = [RequestRecord(t, t + 0.25, t + 0.5) for t in (0.0, 0.5, 1.0, 1.5)]
    assert summarize(records, "open", 2.0, 0.0).sent_per_s == pytest.approx(4 / 1.75)


def test_summary_of_only_errors_has_no_latency():
    s = summarize([RequestRecord(0.0, 0.0, 0.1, "UNAVAILABLE")], "closed", 1.0, 0.0)
    assert (s.num_ok, s.num_errors, s.requests_per_s) == (0, 1, 0.0)
    assert s.latency_ms is None and s.first_result_ms is None


def test_summary_of_nothing_is_empty():
    s = summarize([], "open", 1.0, 0.5)
    assert (s.num_sent, s.window_s, s.requests_per_s, s.latency_ms) == (0, 0.0, 0.0, None)
