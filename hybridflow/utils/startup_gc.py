"""The cyclic garbage collector paused while a process imports its libraries.

Importing torch and transformers creates ~400k long-lived objects, and the collector's full
passes over them while they are being created cost a process 1-1.5 CPU-seconds of its start
(measured on the quickstart's learner: 9.9-11.1 CPU-s with the collector on, 8.3-9.7 paused),
all of it on the path to the first step on a machine of 2 cores. ``pause_collection`` at
the top of ``main``; ``resume_collection`` once the imports are done and before anything
else is built: it moves every object alive then (modules, classes, functions) into the
permanent generation (``gc.freeze``), where later collections no longer walk them, and
turns the collector back on. What became garbage during the imports stays (about 8 MB per
process); nothing built after the resume (a model, a dataset) is affected, so a model's
temporary tensors are collected as ever.
"""

from __future__ import annotations

import gc

_paused = False


def pause_collection() -> None:
    """Turns the collector off until ``resume_collection`` (a no-op if it already is off)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume_collection() -> None:
    """Freezes what is alive now and turns the collector back on, if ``pause_collection``
    turned it off (a collector someone else turned off stays off)."""
    global _paused
    if _paused:
        gc.freeze()
        gc.enable()
        _paused = False
