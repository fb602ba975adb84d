"""Small stand-ins for quick checks and tests: a tiny random actor and simple rewards.

from hybridflow import RLTrainer
from hybridflow.testing import mock_actor, mock_reward
trainer = RLTrainer(actor=mock_actor(), reward_fn=mock_reward, algo="ppo")
print(trainer.step(prompts=["1+2=", "3+4="]).metrics)
"""

from __future__ import annotations

import re
from pathlib import Path


def mock_actor(root: str | Path | None = None) -> Path:
    """Path of a tiny Llama checkpoint (the built-in tiny model: shipped weights, cached)."""
    from hybridflow.models.builtin import ensure_builtin_model

    return ensure_builtin_model("tiny", root)


def mock_reward(prompt: str, response: str) -> float:
    """1.0 when the response is the right sum for an "a+b=" prompt, 0.0 otherwise; for any
    other prompt, the fraction of digits in the response (something a policy can learn)."""
    match = re.fullmatch(r"\s*(\d+)\s*\+\s*(\d+)\s*=\s*", prompt)
    if match:
        return float(response.strip() == str(int(match[1]) + int(match[2])))
    return sum(ch.isdigit() for ch in response) / max(len(response), 1)
