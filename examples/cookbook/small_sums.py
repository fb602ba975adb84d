"""Supervised warm start, then RL, with the Tinker cookbook's own pieces against hybridflow's
Tinker-compatible service: the environment is the cookbook's ``ArithmeticEnv`` (its prompt,
few-shot prefix, grading and format reward), asked about sums of one-digit numbers, which the
built-in 2-layer model can learn (the ``math_rl`` recipe asks about sums of 0-100, beyond it).

Run it with the cookbook's venv (``make cookbook-venv``), the service up and
``TINKER_API_KEY`` set (docs/tinker.md):

    python examples/cookbook/small_sums.py data sums.jsonl          # the warm start's data
    python -m tinker_cookbook.recipes.chat_sl.train dataset=sums.jsonl renderer_name=qwen3_instruct ...
    python examples/cookbook/small_sums.py rl --base-url URL --model DIR --log-path DIR \\
        --load tinker://<the warm start's state_path>

``data`` writes conversations whose answers are right half the time and off by one or two
otherwise, so the warm-started model is unsure of its digits (right about a third of the
time when sampled) while the true sum stays its likeliest answer; RL then sharpens it.
``rl`` is the cookbook's RL loop (``tinker_cookbook.rl.train.main``) with a dataset of such
problems, one batch of groups per step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from collections.abc import Sequence
from functools import partial

RENDERER = "qwen3_instruct"
"""No thinking block: the built-in model's small vocabulary spells ``<think>`` out in many
tokens, and a model this size does not learn to skip them in a short warm start."""

FEWSHOT = [
    {"role": "user", "content": "What is 4 + 5?"},
    {"role": "assistant", "content": "9"},
]
"""The cookbook's ``ArithmeticEnv.standard_fewshot_prefix``, written out so ``data`` needs only
the standard library."""


def write_data(path: str, examples: int, correct_prob: float, max_operand: int, seed: int) -> None:
    """Chat-format conversations (``chat_sl``'s file format) of one-digit sums with noisy answers."""
    rng = random.Random(seed)
    with open(path, "w") as out:
        for _ in range(examples):
            x, y = rng.randint(0, max_operand), rng.randint(0, max_operand)
            answer = x + y
            if rng.random() >= correct_prob:
                answer = max(0, answer + rng.choice([-2, -1, 1, 2]))
            messages = [
                *FEWSHOT,
                {"role": "user", "content": f"What is {x} + {y}?"},
                {"role": "assistant", "content": str(answer)},
            ]
            out.write(json.dumps({"messages": messages}) + "\n")


def run_rl(args: argparse.Namespace) -> None:
    """The cookbook's RL loop on small sums, from the warm start's state when ``--load`` names
    one."""
    import chz
    import numpy as np
    from tinker_cookbook import renderers
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticEnv
    from tinker_cookbook.rl import train
    from tinker_cookbook.rl.problem_env import ProblemGroupBuilder
    from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    class SmallSums(RLDataset):
        def __init__(self, renderer: renderers.Renderer) -> None:
            self.renderer = renderer

        def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
            rng = np.random.RandomState(args.seed + index)
            builders: list[EnvGroupBuilder] = []
            for _ in range(args.groups):
                x, y = (int(v) for v in rng.randint(0, args.max_operand + 1, size=2))
                env = partial(
                    ArithmeticEnv,
                    x,
                    y,
                    renderer=self.renderer,
                    convo_prefix=ArithmeticEnv.standard_fewshot_prefix(),
                )
                builders.append(ProblemGroupBuilder(env_thunk=env, num_envs=args.group_size))
            return builders

        def __len__(self) -> int:
            return args.steps

    @chz.chz
    class SmallSumsBuilder(RLDatasetBuilder):
        async def __call__(self) -> tuple[SmallSums, None]:
            tokenizer = get_tokenizer(args.model)
            return SmallSums(renderers.get_renderer(RENDERER, tokenizer=tokenizer)), None

    config = train.Config(
        learning_rate=args.lr,
        dataset_builder=SmallSumsBuilder(),
        model_name=args.model,
        recipe_name="small_sums_rl",
        renderer_name=RENDERER,
        lora_rank=args.lora_rank,
        max_tokens=4,
        log_path=args.log_path,
        base_url=args.base_url,
        load_checkpoint_path=args.load,
        eval_every=0,
        save_every=args.steps,
    )
    asyncio.run(train.main(config))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    data = commands.add_parser("data", help="write the warm start's conversations")
    data.add_argument("path")
    data.add_argument("--examples", type=int, default=2048)
    data.add_argument("--correct-prob", type=float, default=0.5)
    data.add_argument("--max-operand", type=int, default=9)
    data.add_argument("--seed", type=int, default=0)
    rl = commands.add_parser("rl", help="RL with the cookbook's loop")
    rl.add_argument("--base-url", required=True)
    rl.add_argument("--model", required=True, help="the base model's name (its local folder)")
    rl.add_argument("--log-path", required=True)
    rl.add_argument("--load", default=None, help="a tinker:// state path to start from")
    rl.add_argument("--steps", type=int, default=30)
    rl.add_argument("--groups", type=int, default=16, help="problems per step")
    rl.add_argument("--group-size", type=int, default=8, help="samples per problem")
    rl.add_argument("--lr", type=float, default=1e-3)
    rl.add_argument("--lora-rank", type=int, default=32)
    rl.add_argument("--max-operand", type=int, default=9)
    rl.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.command == "data":
        write_data(args.path, args.examples, args.correct_prob, args.max_operand, args.seed)
    else:
        run_rl(args)


if __name__ == "__main__":
    main()
