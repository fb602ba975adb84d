"""Offline evaluation of one policy (``hybridflow-coordinator eval``): the evaluation of
``coordinator.eval`` run once, against replicas that loaded the policy from disk.

``evaluate_once`` runs the same ``Evaluator`` as a training job's (the same sets, sampling,
seeds, request chunks and version pin), so the offline evaluation of a run's exported step
gives the metrics the run's own evaluation of that step logged. ``write_results`` writes
what it found under its output directory:

- ``results.json``: what was evaluated (``model``, ``step``, ``policy_version``) and each
  set's metrics, named as in metrics.jsonl (``eval/<name>/...``);
- ``samples.jsonl``: one line per prompt: set, prompt text, data source, and each
  completion's text, score, finish reason and version, from which any metric can be
  computed again;

and, for a run's checkpoint, appends the results to the run's ``eval_offline.jsonl``
(one line per set: step, name, version, metrics), which the run report draws beside the
run's own evaluations. Knows nothing of processes or gRPC.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridflow.arrays import TokenArray
from hybridflow.clients import RewardClient, RolloutClient
from hybridflow.coordinator.dataflow import ScoredGroup
from hybridflow.coordinator.episodes import EpisodeSource
from hybridflow.coordinator.eval_config import EvalConfig
from hybridflow.coordinator.evaluation import EvalResult, EvalSet, Evaluator, eval_params
from hybridflow.coordinator.report import OFFLINE_EVAL_FILE


@dataclass
class EvalClients:
    """What an offline evaluation calls (``evaluation.EvalServices``): no learner."""

    rollouts: Sequence[RolloutClient]
    reward: RewardClient
    decode: Callable[[TokenArray], str]
    environments: Any = None
    """Multi-turn: the environment service's client the episodes step."""
    tokenizer: Any = None
    """Multi-turn: the tokenizer whose chat template renders the observations."""
    weight_targets: Sequence[str] = ()
    """Each replica's address (agent episodes generate on it by address)."""


@dataclass
class OfflineResult:
    """One offline evaluation: every set's result and its scored samples."""

    model: str
    step: int
    policy_version: int
    results: list[EvalResult]
    groups: dict[str, list[ScoredGroup]]
    seconds: float

    @property
    def complete(self) -> bool:
        return all(r.complete for r in self.results)


def evaluate_once(
    config: EvalConfig,
    sets: Sequence[EvalSet],
    clients: EvalClients,
    *,
    max_new_tokens: int,
    seed: int,
    out_dir: Path,
    model: str,
    step: int,
    policy_version: int,
    episodes: EpisodeSource | None = None,
) -> OfflineResult:
    """Evaluates what the replicas serve on every set, as the job's evaluation of ``step``
    would (``max_new_tokens`` and ``seed``: the job's sampling limit and seed); the result
    is labelled with ``policy_version`` (the checkpoint's: a replica that loaded it from
    disk reports version 0). Bounded by ``config.timeout_s``."""
    start = time.monotonic()
    params = eval_params(config, max_new_tokens, seed)
    evaluator = Evaluator(config, sets, clients, params, out_dir, threading.Event(), episodes)
    evaluator.start(step)
    evaluator.wait()
    results = [_labelled(r, policy_version) for r in evaluator.take_results()]
    return OfflineResult(
        model,
        step,
        policy_version,
        results,
        dict(evaluator.last_groups),
        time.monotonic() - start,
    )


def _labelled(result: EvalResult, policy_version: int) -> EvalResult:
    """``result`` with the checkpoint's version in place of the replicas' (every sample
    came whole from the one policy they loaded: the pin checked it)."""
    metrics = dict(result.metrics)
    metrics[f"eval/{result.name}/policy_version"] = float(policy_version)
    return EvalResult(result.step, result.name, policy_version, metrics, result.complete)


def write_results(
    result: OfflineResult,
    out_dir: Path,
    decode: Callable[[TokenArray], str],
    run_dir: Path | None = None,
) -> Path:
    """Writes ``results.json`` and ``samples.jsonl`` under ``out_dir`` (module docstring)
    and, with ``run_dir``, appends the complete sets to its ``eval_offline.jsonl``; the
    path of results.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {
        "model": result.model,
        "step": result.step,
        "policy_version": result.policy_version,
        "complete": result.complete,
        "seconds": result.seconds,
        "sets": {r.name: r.metrics for r in result.results},
    }
    path = out_dir / "results.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    with (out_dir / "samples.jsonl").open("w") as f:
        for name, groups in result.groups.items():
            for group in groups:
                line = _sample_line(name, group, decode, result.policy_version)
                f.write(json.dumps(line) + "\n")
    if run_dir is not None:
        with (run_dir / OFFLINE_EVAL_FILE).open("a") as f:
            for r in result.results:
                if r.complete:
                    f.write(r.to_json() + "\n")
    return path


def _sample_line(
    name: str, group: ScoredGroup, decode: Callable[[TokenArray], str], version: int
) -> Any:
    """One prompt's line; every completion is labelled with the evaluated checkpoint's
    ``version`` (the pin made them all one version's; a replica that loaded the policy from
    disk counts its own versions from 0)."""
    prompt = group.prompt
    return {
        "set": name,
        "index": prompt.index,
        "data_source": prompt.data_source,
        "prompt": prompt.prompt_text,
        "ground_truth": prompt.ground_truth,
        "completions": [
            {
                "text": decode(c.token_ids),
                "num_tokens": int(len(c.token_ids)),
                "score": r.score,
                "finish_reason": c.finish_reason,
                "policy_version": version,
            }
            for c, r in zip(group.completions, group.results, strict=True)
        ],
    }


def summary_lines(result: OfflineResult) -> list[str]:
    """Each set's headline for the terminal."""
    lines = []
    for r in result.results:
        keys = sorted(k for k in r.metrics if k.rsplit("/", 1)[-1].startswith(("pass@", "mean@")))
        parts = [f"{k.rsplit('/', 1)[-1]} {r.metrics[k]:.3f}" for k in keys]
        num = int(r.metrics.get(f"eval/{r.name}/num_prompts", 0))
        state = "" if r.complete else " (timed out: not recorded)"
        lines.append(
            f"eval {r.name} of {result.model} (step {r.step}, policy v{r.policy_version}, "
            f"{num} prompts): {', '.join(parts)}{state}"
        )
    return lines
