"""Warm-start demonstrations of the built-in environments, written as an SFT dataset.

Each demonstration is a full successful conversation (``calc``: question, one calculator call,
its result, the answer; ``guess``: a binary search). The offline SFT job reads
``prompt`` / ``response`` rows (``hybridflow.data.preference``), so a conversation becomes one
row per assistant turn: ``prompt`` = every message before that turn, ``response`` = that
assistant message; the job trains on the response's tokens only, so together the rows teach
every assistant turn once, each in its full context.

    python -m hybridflow.envs.demonstrations --data builtin:calc --num 512 --out calc_sft.jsonl

(rows drawn with seed 1 by default, apart from an RL run's seed 0, so the warm start does not
see the answers of the tasks RL then trains on)
then ``deploy/launch.sh --config deploy/configs/dpo.yaml --set preference.loss=sft
--set preference.data=calc_sft.jsonl ...`` (a model whose chat template renders ``tool``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hybridflow.envs.base import Message
from hybridflow.envs.builtin import BUILTIN_ENV_DATASETS, builtin_env_dataset
from hybridflow.envs.tasks import messages_to_dicts, task_from_row


def iter_demonstrations(spec: str, num: int, seed: int = 0) -> Iterator[list[Message]]:
    """A successful conversation for each of the first ``num`` rows of ``spec`` (a built-in
    environment dataset, with the same seed it is trained with)."""
    entry = builtin_env_dataset(spec)
    for row in entry.make_rows(num, seed):
        yield entry.demonstration(task_from_row(row))


def sft_rows(conversation: Sequence[Message]) -> list[dict[str, Any]]:
    """One SFT row per assistant turn of ``conversation`` (see the module docstring)."""
    return [
        {"prompt": messages_to_dicts(conversation[:i]), "response": messages_to_dicts([message])}
        for i, message in enumerate(conversation)
        if message.role == "assistant"
    ]


def write_sft_dataset(path: Path, spec: str, num: int, seed: int = 0) -> int:
    """Writes the SFT rows of ``num`` demonstrations of ``spec`` to ``path`` (JSONL);
    returns the number of rows."""
    if num < 1:
        raise ValueError(f"num must be >= 1, got {num}")
    count = 0
    with path.open("w", encoding="utf-8") as f:
        for conversation in iter_demonstrations(spec, num, seed):
            for row in sft_rows(conversation):
                f.write(json.dumps(row) + "\n")
                count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, choices=sorted(BUILTIN_ENV_DATASETS))
    parser.add_argument("--num", type=int, default=512, help="demonstrations (conversations)")
    parser.add_argument(
        "--seed",
        type=int,
        default=1,
        help="the rows' seed: keep it apart from the RL run's seed (0 by default), so the "
        "warm start does not see the answers of the tasks RL trains on",
    )
    parser.add_argument("--out", type=Path, required=True, help="the .jsonl file to write")
    args = parser.parse_args(argv)
    count = write_sft_dataset(args.out, args.data, args.num, args.seed)
    print(f"wrote {count} SFT rows from {args.num} {args.data} demonstrations to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
