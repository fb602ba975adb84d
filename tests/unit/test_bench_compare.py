"""benchmarks/compare: the verdict of a side-by-side run against hand-computed cases, the order
the launches run in, HEAD's tree (the working tree as it is), the busy-machine warning, and the
command's refusals (a run that cannot measure its noise, a commit that does not exist)."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from benchmarks.compare import quiet, run_compare
from benchmarks.compare.verdict import (
    FigureVerdict,
    compare,
    exit_code,
    figures_compared,
)


def verdict(figure: str, base: tuple[float, ...], head: tuple[float, ...]) -> FigureVerdict:
    return FigureVerdict("sync", figure, base, head)


def spread(scale: float, repeats: int, log_step: float = 0.1) -> tuple[float, ...]:
    """``repeats`` launches around ``scale``, each ``log_step`` above or below it in log
    units, alternating: their geometric mean is ``scale`` (even ``repeats``)."""
    return tuple(scale * math.exp(log_step if i % 2 == 0 else -log_step) for i in range(repeats))


def test_a_30_percent_slower_learner_is_a_regression() -> None:
    v = verdict("median_learner_compute_s", (1.00, 1.02, 0.98), (1.30, 1.31, 1.29))
    assert v.speedup == pytest.approx(1.00 / 1.30, rel=1e-3)  # seconds: BASE / HEAD
    assert v.status == "regression"


def test_the_noise_is_the_pooled_spread_of_the_logs_and_the_band_a_one_sided_t_test() -> None:
    # Six launches a side, each 0.1 above or below its side's mean in log units: the pooled
    # standard deviation is sqrt(12 * 0.01 / 10), the standard error of the log ratio
    # that times sqrt(2 / 6), and the band t(10 df, 99 %) = 2.764 of them.
    base = spread(100.0, 6)
    v = verdict("e2e_samples_per_s", base, spread(80.0, 6))
    assert v.speedup == pytest.approx(0.80)  # rates: HEAD / BASE
    assert v.noise == pytest.approx(math.sqrt(0.012))
    assert v.standard_error == pytest.approx(math.sqrt(0.012) * math.sqrt(2 / 6))
    assert v.band == pytest.approx(2.764 * math.sqrt(0.012 / 3))
    assert v.threshold == pytest.approx(0.8396, abs=1e-4)
    assert v.status == "regression"
    # 10 % slower with launches spreading 10 %: inside what the run measured, not a finding.
    assert verdict("e2e_samples_per_s", base, spread(90.0, 6)).status == "same"


def test_more_repeats_narrow_the_band_until_a_run_can_rule_out_a_25_percent_slowdown() -> None:
    # The same 10 % spread: three launches a side cannot tell a 25 % slowdown from noise,
    # six can (and the 5 % slower HEAD is then "same").
    few = verdict("e2e_samples_per_s", spread(100.0, 3), spread(95.0, 3))
    many = verdict("e2e_samples_per_s", spread(100.0, 6), spread(95.0, 6))
    assert few.threshold < 0.75 < many.threshold
    assert (few.status, many.status) == ("inconclusive", "same")
    # A regression bigger than even the wide band is one all the same.
    assert verdict("e2e_samples_per_s", spread(100.0, 3), spread(40.0, 3)).status == "regression"


def test_below_the_floor_band_is_the_same_and_above_it_faster() -> None:
    quiet = (100.0, 100.0, 100.0)
    assert verdict("e2e_samples_per_s", quiet, (96.0, 96.0, 96.0)).status == "same"  # 5 % floor
    assert verdict("e2e_samples_per_s", quiet, (94.0, 94.0, 94.0)).status == "regression"
    assert verdict("e2e_samples_per_s", quiet, (110.0, 110.0, 110.0)).status == "faster"


def test_more_memory_beyond_the_noise_is_a_regression() -> None:
    mib = 1024 * 1024
    v = verdict("peak_rss_bytes/learner", (500 * mib,) * 3, (560 * mib,) * 3)
    assert v.speedup == pytest.approx(500 / 560)
    assert v.status == "regression"


def test_compare_takes_every_figure_both_sides_measured_and_the_exit_code_follows() -> None:
    run = {"e2e_samples_per_s": 100.0, "median_learner_compute_s": 1.0, "median_gen_s_per_step": 0}
    base = {"sync": [dict(run) for _ in range(3)]}
    head = {"sync": [dict(run, median_learner_compute_s=1.3) for _ in range(3)]}
    verdicts = compare(base, head)
    assert [(v.figure, v.status) for v in verdicts] == [
        ("e2e_samples_per_s", "same"),
        ("median_learner_compute_s", "regression"),
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


def test_the_sides_run_back_to_back_per_variant_their_order_swapped_each_time(
    monkeypatch, tmp_path: Path
) -> None:
    launched: list[str] = []

    def fake_run_variant(cfg, label, overrides, out, root):
        launched.append(label)
        return root

    monkeypatch.setattr(run_compare, "run_variant", fake_run_variant)
    monkeypatch.setattr(
        run_compare, "run_figures", lambda run_dir, warmup: {"e2e_samples_per_s": 1.0}
    )
    found = run_compare.run_sides(
        "benchmarks/compare/ci.yaml", {"base": tmp_path, "head": tmp_path}, 2, [], tmp_path
    )
    assert launched == [
        "base_sync_r1", "head_sync_r1", "head_async_r1", "base_async_r1",
        "head_sync_r2", "base_sync_r2", "base_async_r2", "head_async_r2",
    ]  # fmt: skip
    # (per variant, each side goes first in one repeat of two)
    assert found["head"]["async"] == [{"e2e_samples_per_s": 1.0}] * 2


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip


def test_heads_tree_is_the_working_tree_as_it_is_and_the_checkout_stays_untouched(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / ".gitignore").write_text("results/\n")
    (repo / "kept.py").write_text("old\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "first")
    head, status = git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain")
    (repo / "kept.py").write_text("changed\n")  # modified, not staged
    (repo / "new.py").write_text("untracked\n")
    (repo / "results").mkdir()
    (repo / "results" / "run.json").write_text("{}\n")  # ignored: not part of the code
    commit = run_compare.working_tree_commit(repo / "results", repo=repo)
    assert git(repo, "show", f"{commit}:kept.py") == "changed"
    assert git(repo, "show", f"{commit}:new.py") == "untracked"
    assert "results/run.json" not in git(repo, "ls-tree", "-r", "--name-only", commit)
    assert git(repo, "rev-parse", f"{commit}^") == head
    assert git(repo, "rev-parse", "HEAD") == head  # no commit on the branch
    assert git(repo, "diff", "--cached", "--name-only") == "" and status == ""  # index as it was


def test_a_busy_machine_is_named_with_its_busiest_processes(monkeypatch) -> None:
    ticks = quiet.os.sysconf("SC_CLK_TCK")
    samples = iter([(0, 0), (3 * ticks, 4 * ticks)])  # 3 of 4 core-seconds busy
    procs = iter([
        {10: ("spinner", 0), 11: ("idle", 5)},
        {10: ("spinner", 2 * ticks), 11: ("idle", 5), 12: ("new", 9)},
    ])  # fmt: skip
    monkeypatch.setattr(quiet, "cpu_jiffies", lambda: next(samples))
    monkeypatch.setattr(quiet, "process_jiffies", lambda: next(procs))
    monkeypatch.setattr(quiet.time, "sleep", lambda s: None)
    monkeypatch.setattr(quiet.os, "cpu_count", lambda: 2)
    assert quiet.busy_report(window_s=2.0) == "1.5 of 2 cores busy: spinner (pid 10) 1.0"
    samples = iter([(0, 0), (ticks // 10, 4 * ticks)])
    procs = iter([{}, {}])
    assert quiet.busy_report(window_s=2.0) == ""  # 0.05 of 2 cores: quiet


def test_the_proc_readers_see_this_process() -> None:
    busy, total = quiet.cpu_jiffies()
    assert 0 < busy <= total
    name, _ = quiet.process_jiffies()[quiet.os.getpid()]
    assert name.startswith("python") or name == "pytest"
