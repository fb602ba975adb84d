"""Batch layout: right padding, response positions, rank splits, micro-batch plans."""

import torch

from hybridflow.services.learner.batch_plans import StepPlan, plan_micro_batches, split_contiguous
from hybridflow.services.learner.batching import build_padded_batch


def test_padded_batch_layout() -> None:
    # Row 0: prompt [5, 6], response [7, 8, 9] -> seq len 5, response predicted at 1, 2, 3.
    # Row 1: prompt [5, 6, 7], response [8] -> predicted at 2; padded slots clamp to 2.
    b = build_padded_batch(
        [[5, 6], [5, 6, 7]], [[7, 8, 9], [8]], pad_id=0, device=torch.device("cpu")
    )
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 6, 7, 8, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 3]]
    assert b.response_index.tolist() == [[1, 2, 3], [2, 2, 2]]
    assert b.response_ids.tolist() == [[7, 8, 9], [8, 0, 0]]
    assert b.response_mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_filler_rows_have_zero_mask() -> None:
    b = build_padded_batch([[5]], [[6, 7]], 0, torch.device("cpu"), row_weights=[0.0])
    assert b.response_mask.tolist() == [[0.0, 0.0]]


def test_split_contiguous() -> None:
    assert split_contiguous(5, 2) == [range(0, 3), range(3, 5)]
    assert split_contiguous(1, 3) == [range(0, 1), range(1, 1), range(1, 1)]


def test_micro_batch_plans_have_equal_length_on_every_rank() -> None:
    slices = [[0, 1, 2], [3, 4]]  # micro size 2: rank 0 needs 2 micro-batches, rank 1 one
    plan0 = plan_micro_batches(slices, 0, 2, filler_index=0)
    plan1 = plan_micro_batches(slices, 1, 2, filler_index=0)
    assert [m.indices for m in plan0] == [[0, 1], [2]]
    assert [m.indices for m in plan1] == [[3, 4], [0]]
    assert plan1[1].weights == [0.0]
    empty = plan_micro_batches([[0], []], 1, 4, filler_index=0)
    assert [(m.indices, m.weights) for m in empty] == [([0], [0.0])]


def test_step_plan_slices_each_mini_batch() -> None:
    plan = StepPlan.build(num_samples=7, num_mini_batches=2, world_size=2, rank=1)
    # mini-batches [0..3], [4..6]; rank slices [0,1],[2,3] and [4,5],[6]
    assert plan.rank_slices == [[[0, 1], [2, 3]], [[4, 5], [6]]]
    assert plan.owned == [2, 3, 6]
