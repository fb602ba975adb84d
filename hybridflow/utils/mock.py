"""The seed document's mock names, over ``hybridflow.testing``: a tiny actor and a simple reward.

    from hybridflow import RLTrainer
    from hybridflow.utils.mock import MockActor, MockRewardFunction
    trainer = RLTrainer(actor=MockActor(), reward_fn=MockRewardFunction(), algo="ppo")
    print(trainer.step(prompts=["请写一首关于春天的诗"]).metrics)

The built-in tiny model's character tokenizer knows printable ASCII only: other characters
(the Chinese prompt above) encode to its ``<unk>`` token, one per character, so such a prompt
still trains, as a run of unknown tokens. This module adds no behaviour of its own.
"""

from __future__ import annotations

from pathlib import Path

from hybridflow.testing import mock_actor, mock_reward


def MockActor(root: str | Path | None = None) -> Path:
    """verl's ``MockActor()``, here a function: the path of the built-in tiny checkpoint
    (shipped weights, cached), which ``RLTrainer(actor=...)`` takes like any checkpoint directory.

    root: cache directory (None: ``$HYBRIDFLOW_HOME/models``, else ``~/.cache/hybridflow/models``).
    """
    return mock_actor(root)


class MockRewardFunction:
    """``reward_fn(prompt, response) -> float`` for quick checks: ``hybridflow.testing.mock_reward``.

    Rewards 1.0 for the exact sum after an "a+b=" prompt (0.0 otherwise); for any other prompt,
    the fraction of the response's characters that are digits, something the tiny model (warm
    started on arithmetic) can raise within a few steps. Not a model of response quality.
    """

    def __call__(self, prompt: str, response: str) -> float:
        return mock_reward(prompt, response)
