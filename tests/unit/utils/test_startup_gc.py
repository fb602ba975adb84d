"""The collector is paused during a start's imports and back on afterwards, with what was
alive frozen; a collector turned off by someone else stays off."""

from __future__ import annotations

import gc

from hybridflow.utils import startup_gc


def test_pause_then_resume_freezes_what_is_alive_and_collects_again():
    assert gc.isenabled()
    frozen_before = gc.get_freeze_count()
    try:
        startup_gc.pause_collection()
        assert not gc.isenabled()
        alive = [[] for _ in range(100)]  # made while paused: frozen on resume
        startup_gc.resume_collection()
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen_before + len(alive)

        class Cycle:
            pass

        a, b = Cycle(), Cycle()
        a.other, b.other = b, a  # type: ignore[attr-defined]
        del a, b
        assert gc.collect() >= 2  # garbage made after the resume is collected
    finally:
        gc.unfreeze()
        gc.enable()


def test_a_collector_someone_else_turned_off_stays_off():
    gc.disable()
    try:
        startup_gc.pause_collection()
        startup_gc.resume_collection()
        assert not gc.isenabled()
    finally:
        gc.enable()
