"""benchmarks/compare: the verdict of a side-by-side run against hand-computed cases, and the
command's refusals (a run that cannot measure its noise, a commit that does not exist)."""

from __future__ import annotations

import pytest

from benchmarks.compare import run_compare
from benchmarks.compare.verdict import (
    FigureVerdict,
    compare,
    exit_code,
    figures_compared,
)


def verdict(figure: str, base: tuple[float, ...], head: tuple[float, ...]) -> FigureVerdict:
    return FigureVerdict("sync", figure, base, head)


def test_a_30_percent_slower_learner_is_a_regression() -> None:
    v = verdict("mean_learner_compute_s", (1.00, 1.02, 0.98), (1.30, 1.31, 1.29))
    assert v.speedup == pytest.approx(1.00 / 1.30)  # seconds: BASE / HEAD
    assert v.noise == pytest.approx(0.04)  # BASE: 0.04 / 1.00; HEAD: 0.02 / 1.30
    assert v.status == "regression"


def test_fewer_samples_per_second_beyond_the_noise_is_a_regression() -> None:
    v = verdict("e2e_samples_per_s", (100.0, 104.0, 98.0), (85.0, 86.0, 84.0))
    assert v.speedup == pytest.approx(0.85)  # rates: HEAD / BASE
    assert v.band == pytest.approx(0.06)  # BASE's range, 6 / 100
    assert v.status == "regression"


def test_a_change_inside_the_measured_noise_is_the_same() -> None:
    # 10 % apart, but BASE's own repeats spread 12 %: not a finding.
    v = verdict("e2e_samples_per_s", (100.0, 106.0, 94.0), (90.0, 91.0, 92.0))
    assert v.speedup == pytest.approx(0.91)
    assert v.band == pytest.approx(0.12)
    assert v.status == "same"


def test_below_the_floor_band_is_the_same_and_above_it_faster() -> None:
    quiet = (100.0, 100.0, 100.0)
    assert verdict("e2e_samples_per_s", quiet, (96.0, 96.0, 96.0)).status == "same"  # 5 % floor
    assert verdict("e2e_samples_per_s", quiet, (94.0, 94.0, 94.0)).status == "regression"
    assert verdict("e2e_samples_per_s", quiet, (110.0, 110.0, 110.0)).status == "faster"


def test_too_noisy_a_run_is_inconclusive_unless_the_regression_is_bigger_still() -> None:
    noisy = (100.0, 140.0, 70.0)  # 70 % range: a 25 % slowdown could hide in it
    assert verdict("e2e_samples_per_s", noisy, (95.0, 96.0, 97.0)).status == "inconclusive"
    assert verdict("e2e_samples_per_s", noisy, (20.0, 21.0, 22.0)).status == "regression"


def test_more_memory_beyond_the_noise_is_a_regression() -> None:
    mib = 1024 * 1024
    v = verdict("peak_rss_bytes/learner", (500 * mib,) * 3, (560 * mib,) * 3)
    assert v.speedup == pytest.approx(500 / 560)
    assert v.status == "regression"


def test_compare_takes_every_figure_both_sides_measured_and_the_exit_code_follows() -> None:
    run = {"e2e_samples_per_s": 100.0, "mean_learner_compute_s": 1.0, "mean_gen_s_per_step": 0.0}
    base = {"sync": [dict(run) for _ in range(3)]}
    head = {"sync": [dict(run, mean_learner_compute_s=1.3) for _ in range(3)]}
    verdicts = compare(base, head)
    assert [(v.figure, v.status) for v in verdicts] == [
        ("e2e_samples_per_s", "same"),
        ("mean_learner_compute_s", "regression"),
    ]  # a figure that is 0 was not measured: left out, not a division by zero
    assert exit_code(verdicts) == 1
    assert exit_code(compare(base, base)) == 0
    noisy = {"sync": [dict(run, e2e_samples_per_s=x) for x in (100.0, 150.0, 60.0)]}
    assert exit_code(compare(noisy, noisy)) == 3


def test_figures_compared_flattens_peak_rss_per_service() -> None:
    run = {"e2e_samples_per_s": 50, "wall_s": 9.0, "peak_rss_bytes": {"learner": 7, "reward": 3}}
    assert figures_compared(run) == {
        "e2e_samples_per_s": 50.0,
        "peak_rss_bytes/learner": 7.0,
        "peak_rss_bytes/reward": 3.0,
    }


def test_the_command_refuses_too_few_repeats_and_an_unknown_commit(capsys) -> None:
    with pytest.raises(SystemExit) as err:
        run_compare.main(["--base", "HEAD", "--repeats", "2"])
    assert err.value.code == 2 and "at least 3" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        run_compare.main(["--base", "no-such-rev-anywhere"])
    assert err.value.code == 2 and "no-such-rev-anywhere" in capsys.readouterr().err
