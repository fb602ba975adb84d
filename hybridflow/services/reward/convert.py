"""Proto ↔ domain conversions of the reward service."""

from __future__ import annotations

import json
from collections.abc import Sequence

from hybridflow.types import ScoreItem, ScoreResult
from hybridflow.v1 import reward_pb2


def items_to_proto(items: Sequence[ScoreItem]) -> reward_pb2.ScoreRequest:
    # A group's n items share their prompt's extra_info dict: encode each dict once.
    encoded: dict[int, str] = {}

    def extra_json(info: dict[str, object]) -> str:
        if not info:
            return ""
        if id(info) not in encoded:
            encoded[id(info)] = json.dumps(info)
        return encoded[id(info)]

    return reward_pb2.ScoreRequest(
        items=[
            reward_pb2.ScoreItem(
                data_source=it.data_source,
                response=it.response,
                has_ground_truth=it.ground_truth is not None,
                ground_truth=it.ground_truth or "",
                prompt=it.prompt,
                extra_info_json=extra_json(it.extra_info),
            )
            for it in items
        ]
    )


def items_from_proto(msg: reward_pb2.ScoreRequest) -> list[ScoreItem]:
    items = []
    for i, it in enumerate(msg.items):
        extra = {}
        if it.extra_info_json:
            try:
                extra = json.loads(it.extra_info_json)
            except json.JSONDecodeError as exc:
                raise ValueError(f"items[{i}].extra_info_json is not valid JSON: {exc}") from exc
            if not isinstance(extra, dict):
                raise ValueError(f"items[{i}].extra_info_json must be a JSON object")
        items.append(
            ScoreItem(
                data_source=it.data_source,
                response=it.response,
                ground_truth=it.ground_truth if it.has_ground_truth else None,
                prompt=it.prompt,
                extra_info=extra,
            )
        )
    return items


def results_to_proto(results: Sequence[ScoreResult]) -> reward_pb2.ScoreResponse:
    return reward_pb2.ScoreResponse(
        results=[
            reward_pb2.ScoreResult(
                score=r.score, error=r.error or "", components=r.components, outcome=r.outcome
            )
            for r in results
        ],
        num_errors=sum(r.error is not None for r in results),
    )


def results_from_proto(msg: reward_pb2.ScoreResponse) -> list[ScoreResult]:
    return [
        ScoreResult(
            score=r.score,
            error=r.error or None,
            components=dict(r.components),
            outcome=r.outcome,
        )
        for r in msg.results
    ]
