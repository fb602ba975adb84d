"""Building the shipped built-in checkpoints and gating them on quality: ``make builtins``
(``build.py``), the builds from the specs (``policy.py``, ``tools.py``, ``reward_model.py``),
the measures and their floors (``quality.py``), the tiny-tools measures played as real
episodes (``tools_quality.py``).

Nothing at runtime imports this package: a user loads the shipped weights through
``hybridflow.models`` (``ensure_builtin_model``), never builds them. It sits above the runtime
layers because a gate runs the coordinator's multi-turn loop over the rollout service's HF
engine; ``hybridflow.models`` keeps the specs (what each built-in is, what its hash pins) and
the shipped files, and knows nothing of this package.
"""
