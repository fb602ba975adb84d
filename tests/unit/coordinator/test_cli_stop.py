"""Issue 27, row 11: ``hybridflow-coordinator stop`` exited 0 mid-run without saying the run
is unfinished. It still exits 0 (the stop was accepted), and says where the run stands and
how to continue it."""

from __future__ import annotations

from hybridflow.main.coordinator import stop_hint


def test_stop_says_the_run_is_unfinished_and_how_to_continue() -> None:
    line = stop_hint(25, 60, "/runs/r1")
    assert "step 25 of 60 done" in line and "checkpointed" in line
    assert line.endswith("deploy/launch.sh --resume /runs/r1")
