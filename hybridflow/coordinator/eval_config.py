"""``coordinator.eval``: held-out evaluation while training (imports without torch or grpc).

An evaluation generates ``k`` completions for every prompt of each held-out set under one
policy version (``coordinator/evaluation.py`` holds the rule), scores them with the reward
service (or the environment, for multi-turn episodes) and logs ``eval/<name>/...``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hybridflow.config.fields import field_problems, knob
from hybridflow.config.ranges import raise_problems

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""An eval set's name: it becomes part of metric names (``eval/<name>/pass@k``)."""


@dataclass
class EvalSampling:
    """How evaluation samples (greedy by default)."""

    temperature: float = knob(0.0, ge=0)
    """Softmax temperature; 0 is greedy (then k > 1 repeats the same completion)."""
    top_p: float = knob(1.0, gt=0, le=1)
    """Nucleus mass."""
    top_k: int = knob(0, ge=0)
    """Sample among the k most likely tokens; 0 is off (the hf engine only, as in training)."""
    max_new_tokens: int = knob(0, ge=0)
    """Longest response; 0: ``coordinator.sampling.max_new_tokens``."""

    def validate(self) -> None:
        raise_problems(field_problems(self, "coordinator.eval.sampling"))


@dataclass
class EvalSet:
    """One held-out dataset."""

    name: str = knob("", free="a short name (letters, digits, _ . -), checked by validate")
    """Names its metrics: ``eval/<name>/...``."""
    data: str = knob("", free="a dataset name or path, checked by preflight when the job starts")
    """Any prompt dataset the trainer reads: ``builtin:arith:test`` (the arithmetic task's
    held-out problems), a verl-format .jsonl / .parquet file, ``sharegpt:PATH``, or a
    multi-turn builtin (``builtin:calc``, ``builtin:guess``) for a multi-turn job."""
    size: int = knob(0, ge=0)
    """Prompts to evaluate: the first ``size`` rows (a builtin generates that many); 0: all
    the file's rows, or 64 of a builtin's."""

    def validate(self) -> None:
        raise_problems(field_problems(self, "coordinator.eval.sets[]"))


@dataclass
class EvalConfig:
    """Held-out evaluation while training; off while ``sets`` is empty."""

    sets: list[EvalSet] = field(default_factory=list)
    """The held-out datasets, each evaluated at every evaluation."""
    every: int = knob(0, ge=0)
    """Steps between evaluations (at steps every, 2*every, ...); 0: only before training
    and at the end."""
    before_training: bool = True
    """Evaluate the starting policy (step 0) before the first step trains."""
    at_end: bool = True
    """Evaluate the final policy after the last step, unless ``every`` already did."""
    k: int = knob(1, ge=1, le=64)
    """Completions per prompt: mean@k, pass@k and majority@k are over these."""
    sampling: EvalSampling = field(default_factory=EvalSampling)
    """How evaluation samples."""
    pass_threshold: float = knob(1.0, free="any score: the scorers' own scale")
    """A completion passes when its score is at least this (1.0: the rule scorers' right)."""
    prompts_per_request: int = knob(16, ge=1)
    """Prompts per Generate call of an evaluation (interleaved with training's requests)."""
    timeout_s: float = knob(300.0, gt=0)
    """An evaluation not done after this long is given up and reported
    (``eval/<name>/timed_out``); weight publishes wait for an evaluation at most this long."""

    @property
    def enabled(self) -> bool:
        return bool(self.sets)

    def due(self, step: int, last_step: int) -> bool:
        """Whether the policy after ``step`` (0: before training) is evaluated."""
        if not self.enabled:
            return False
        if step == 0:
            return self.before_training
        if self.every and step % self.every == 0:
            return True
        return self.at_end and step == last_step

    def validate(self) -> None:
        """Each field's bound, plus: every set named (uniquely, as metric names allow) and
        given data."""
        names = [s.name for s in self.sets]
        raise_problems(
            [
                *field_problems(self, "coordinator.eval"),
                *(
                    f"coordinator.eval.sets[{i}].name: {s.name!r} must be 1-64 letters, "
                    "digits, '_', '.' or '-' (it names the metrics eval/<name>/...)"
                    for i, s in enumerate(self.sets)
                    if not NAME.match(s.name)
                ),
                *(
                    f"coordinator.eval.sets[{i}].data: required (a dataset name or path)"
                    for i, s in enumerate(self.sets)
                    if not s.data
                ),
                *(
                    f"coordinator.eval.sets: the name {name!r} is used twice"
                    for name in sorted({n for n in names if names.count(n) > 1})
                ),
            ]
        )
