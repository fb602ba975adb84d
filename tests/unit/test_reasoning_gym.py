"""reasoning-gym's tasks as datasets (``reasoning_gym:<task>?options``) and their own scorers
in the reward service: options keep their types (a ``+`` stays a plus), a seed makes the
same rows and a ``seed=`` option another draw, bad specs are refused naming the spec (and,
in preflight, the key), every row's entry survives JSON, and the reward service's score is
the task's own ``score_answer`` on the same entry, partial credit included."""

from __future__ import annotations

import json

import pytest
import reasoning_gym

from hybridflow.data.datasets import generated_problem, is_generated, read_prompt_dataset
from hybridflow.data.reasoning_gym import parse_spec, reasoning_gym_rows
from hybridflow.deploy.preflight import check_job
from hybridflow.job_config import load_job_config
from hybridflow.models import resolve_model_path
from hybridflow.models.text_only import load_tokenizer
from hybridflow.services.reward.scorers import RewardScorer
from hybridflow.types import ScoreItem

TASK = "basic_arithmetic"
OPTIONS = "max_terms=2&max_digits=1&operators=[+,-]&allow_negation=false"
SPEC = f"reasoning_gym:{TASK}?{OPTIONS}"


def test_a_spec_names_a_task_and_typed_options():
    task, options = parse_spec(SPEC + "&seed=7&format_style=simple")
    assert task == TASK
    assert options == {
        "max_terms": 2,
        "max_digits": 1,
        "operators": ["+", "-"],
        "allow_negation": False,
        "seed": 7,
        "format_style": "simple",
    }
    with pytest.raises(ValueError, match="is not key=value"):
        parse_spec(f"reasoning_gym:{TASK}?max_terms")
    assert is_generated(SPEC) and is_generated("builtin:arith") and not is_generated("a.jsonl")


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("reasoning_gym:no_such_task", "has no task 'no_such_task'"),
        (f"reasoning_gym:{TASK}?bogus=1", "unexpected keyword argument 'bogus'"),
        (f"reasoning_gym:{TASK}?min_terms=5&max_terms=2", "max_terms must be >= min_terms"),
    ],
)
def test_a_bad_spec_is_refused_naming_it(spec, says):
    problem = generated_problem(spec)
    assert problem is not None and spec in problem and says in problem


def test_preflight_refuses_a_bad_task_naming_the_key():
    job = load_job_config(
        "deploy/configs/quickstart.yaml", ["coordinator.data=reasoning_gym:no_such_task"]
    )
    problems = check_job(job)
    assert any("coordinator.data" in p and "no_such_task" in p for p in problems), problems


def test_rows_are_the_tasks_entries_reproducibly():
    rows = reasoning_gym_rows(SPEC, 12, seed=3, chat=False)
    again = reasoning_gym_rows(SPEC, 12, seed=3, chat=False)
    other = reasoning_gym_rows(SPEC + "&seed=99", 12, seed=3, chat=False)
    assert rows == again and rows != other
    expected = reasoning_gym.create_dataset(
        TASK, size=12, seed=3, max_terms=2, max_digits=1, operators=["+", "-"],
        allow_negation=False,
    )  # fmt: skip
    for row, entry in zip(rows, expected, strict=True):
        assert row["prompt"] == entry["question"]
        assert row["reward_model"]["ground_truth"] == entry["answer"]
        assert row["data_source"] == f"reasoning_gym/{TASK}"
        saved = row["extra_info"]["reasoning_gym"]
        assert saved["task"] == TASK and saved["entry"] == json.loads(json.dumps(entry))
    chat = reasoning_gym_rows(SPEC, 1, seed=3, chat=True)
    assert chat[0]["prompt"] == [{"role": "user", "content": rows[0]["prompt"]}]


def test_the_reward_is_the_tasks_own_score_on_the_same_entry():
    tokenizer = load_tokenizer(resolve_model_path("builtin:tiny"))
    records = read_prompt_dataset(SPEC, tokenizer, 6, seed=1).records
    dataset = reasoning_gym.create_dataset(
        TASK, size=6, seed=1, max_terms=2, max_digits=1, operators=["+", "-"],
        allow_negation=False,
    )  # fmt: skip
    scorer = RewardScorer()
    try:
        for record, entry in zip(records, dataset, strict=True):
            answer = str(entry["answer"])
            responses = [answer, f"<answer>{answer}</answer>", f"{answer}0", "x"]
            items = [
                ScoreItem(record.data_source, r, record.ground_truth, record.prompt_text,
                          record.extra_info)
                for r in responses
            ]  # fmt: skip
            scores = [r.score for r in scorer.score_batch(items)]
            own = [dataset.score_answer(a, entry) for a in (answer, answer, f"{answer}0", "x")]
            assert scores == own
            assert scores[0] == scores[1] == 1.0 and 0.0 < scores[2] < 1.0 and scores[3] == 0.0
        lost = scorer.score_batch([ScoreItem(f"reasoning_gym/{TASK}", "3", "3")])[0]
        assert lost.score == 0.0 and "needs extra_info['reasoning_gym']" in (lost.error or "")
    finally:
        scorer.close()


def test_a_prompt_function_renders_the_entry_and_the_score_is_unchanged():
    fn = "hybridflow.data.reasoning_gym:expression_prompt"
    plain = reasoning_gym_rows(SPEC, 8, seed=3, chat=False)
    rendered = reasoning_gym_rows(f"{SPEC}&prompt={fn}", 8, seed=3, chat=False)
    for row, other in zip(plain, rendered, strict=True):
        expression = row["extra_info"]["reasoning_gym"]["entry"]["metadata"]["expression"]
        assert other["prompt"] == expression.replace(" ", "") + "="  # "4 + 1" -> "4+1="
        assert other["reward_model"] == row["reward_model"]  # the same entry, the same answer
        assert other["extra_info"] == row["extra_info"]
    problem = generated_problem(f"{SPEC}&prompt=nowhere.at_all:fn")
    assert problem is not None and "cannot import 'nowhere.at_all'" in problem
    no_expression = generated_problem(f"reasoning_gym:leg_counting?prompt={fn}")
    assert no_expression is not None and "has no metadata.expression" in no_expression
