"""The seed document's §2.4 snippet, verbatim with ``hybridflow`` for ``verl``, runs and prints
the step's metrics; its mock names are the ``hybridflow.testing`` stand-ins."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from transformers import AutoTokenizer

from hybridflow.models.tokenizer import UNK_TOKEN
from hybridflow.utils.mock import MockActor, MockRewardFunction

REPO = Path(__file__).resolve().parents[2]

SEED_SNIPPET = """\
from hybridflow import RLTrainer
from hybridflow.utils.mock import MockActor, MockRewardFunction
# 初始化模拟训练器
trainer = RLTrainer( actor=MockActor(), reward_fn=MockRewardFunction(), algo='ppo' )
# 执行一轮训练
result = trainer.step(prompts=["请写一首关于春天的诗"])
print(result.metrics)
"""


def test_seed_snippet_prints_losses_and_reward(tiny_model_path: Path) -> None:
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        OMP_NUM_THREADS="1",
        # The session's tiny checkpoint (laid out as <home>/models/tiny-<hash>): no rebuild.
        HYBRIDFLOW_HOME=str(tiny_model_path.parent.parent),
    )
    proc = subprocess.run(
        [sys.executable, "-c", SEED_SNIPPET],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    # The seed's names carry the learner's and the reward's own numbers, not filled-in defaults.
    assert metrics["policy_loss"] == metrics["actor/pg_loss"]
    assert metrics["value_loss"] == metrics["critic/vf_loss"] > 0  # a fresh critic is wrong
    assert metrics["actor/grad_norm"] > 0  # a real backward pass ran
    # MockRewardFunction scores this prompt by the digits in each response: the batch's mean.
    assert metrics["reward_mean"] == metrics["critic/score/mean"]
    assert metrics["critic/score/min"] <= metrics["reward_mean"] <= metrics["critic/score/max"]


def test_mock_actor_is_the_builtin_tiny_checkpoint(tiny_model_path: Path) -> None:
    actor = MockActor(tiny_model_path.parent)
    assert actor == tiny_model_path and (actor / "config.json").is_file()


def test_chinese_prompt_tokenises_to_one_unknown_token_per_character(
    tiny_model_path: Path,
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path))
    ids = tokenizer.encode("请写一首关于春天的诗", add_special_tokens=False)
    assert ids == [tokenizer.convert_tokens_to_ids(UNK_TOKEN)] * 10
    assert tokenizer.encode("诗a", add_special_tokens=False)[1] == tokenizer.encode("a")[0]


def test_mock_reward_function() -> None:
    reward = MockRewardFunction()
    assert reward("3+4=", "7") == 1.0 and reward("3+4=", "8") == 0.0
    assert reward("请写一首关于春天的诗", "12ab") == 0.5
