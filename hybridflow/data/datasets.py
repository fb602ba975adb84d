"""Prompt datasets in verl's format, tokenised once: ``builtin:arith``, JSONL and parquet.

A row holds ``prompt`` (a list of chat messages ``{role, content}``, rendered with the
tokenizer's chat template and a generation prompt, or a plain string used as-is),
``data_source`` (picks the reward scorer), optional ``reward_model.ground_truth`` and optional
``extra_info`` (a dict). Every prompt is tokenised exactly once here; nothing downstream
re-tokenises.

Special tokens: chat prompts are encoded with ``add_special_tokens=False`` (the template
already writes BOS and friends); plain-string prompts are encoded the same way, except that a
tokenizer whose config sets ``add_bos_token`` gets its BOS prepended (once), as its model
expects. EOS is never added.

Bad rows raise ValueError naming the file, the line (JSONL) or row (parquet) and the field.
Prompts longer than ``max_prompt_tokens`` are dropped and counted, never silently.
This module knows nothing about rollout, rewards or the coordinator's cursor.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

BUILTIN_DATASETS = ("builtin:arith",)
DEFAULT_BUILTIN_NUM = 1024
"""Rows generated for a builtin dataset when ``num`` is None."""


@dataclass
class PromptRecord:
    """One prompt, tokenised, with what the reward service needs to score its responses."""

    prompt_text: str
    """The text that was tokenised (chat template applied for chat prompts)."""
    prompt_ids: list[int]
    """Token ids of ``prompt_text``."""
    data_source: str
    """Picks the reward scorer."""
    ground_truth: str | None
    """``reward_model.ground_truth`` as a string, None when the row has none."""
    extra_info: dict[str, Any] = field(default_factory=dict)
    """The row's ``extra_info`` (passed to user scorers)."""
    index: int = 0
    """0-based row number in the source: unique and stable (gaps where rows were dropped)."""


@dataclass
class PromptDataset:
    """The loaded records plus what was left out."""

    records: list[PromptRecord]
    """Kept records, in source order."""
    num_dropped_too_long: int = 0
    """Rows dropped because their prompt exceeded ``max_prompt_tokens``."""


def load_prompt_dataset(
    spec: str,
    tokenizer: Any,
    num: int | None = None,
    seed: int = 0,
    max_prompt_tokens: int | None = None,
) -> list[PromptRecord]:
    """Records of ``spec``; over-long prompts are dropped and the count logged at WARNING.

    See ``read_prompt_dataset`` for the arguments; use it to get the dropped count as a value.
    """
    dataset = read_prompt_dataset(spec, tokenizer, num, seed, max_prompt_tokens)
    if dataset.num_dropped_too_long:
        logger.warning(
            "dataset %s: dropped %d prompts longer than max_prompt_tokens=%s (kept %d)",
            spec,
            dataset.num_dropped_too_long,
            max_prompt_tokens,
            len(dataset.records),
        )
    return dataset.records


def read_prompt_dataset(
    spec: str,
    tokenizer: Any,
    num: int | None = None,
    seed: int = 0,
    max_prompt_tokens: int | None = None,
) -> PromptDataset:
    """Load and tokenise a dataset.

    spec: ``builtin:arith`` or a path to a ``.jsonl`` or ``.parquet`` file.
    num: keep at most this many records: the first ones in source order, after over-long
        prompts are dropped (None: all; a builtin dataset then generates DEFAULT_BUILTIN_NUM).
    seed: seeds the generation of builtin datasets (files are read in order; shuffle per epoch
        with ``epoch_order``).
    max_prompt_tokens: drop (and count) prompts with more tokens than this (None: keep all).
    """
    if num is not None and num < 0:
        raise ValueError(f"num must be >= 0 or None, got {num}")
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be >= 1 or None, got {max_prompt_tokens}")
    rows = _iter_rows(spec, num, seed)
    records: list[PromptRecord] = []
    num_dropped = 0
    for index, (where, row) in enumerate(rows):
        if num is not None and len(records) >= num:
            break
        record = _row_to_record(row, where, index, tokenizer)
        if max_prompt_tokens is not None and len(record.prompt_ids) > max_prompt_tokens:
            num_dropped += 1
            continue
        records.append(record)
    return PromptDataset(records=records, num_dropped_too_long=num_dropped)


def epoch_order(num_records: int, epoch: int, seed: int, shuffle: bool = True) -> list[int]:
    """Record positions in the order epoch ``epoch`` visits them.

    A seeded permutation that depends only on (num_records, epoch, seed), so a resumed run
    only needs its epoch and cursor; ``shuffle=False`` keeps source order.
    """
    if num_records < 0:
        raise ValueError(f"num_records must be >= 0, got {num_records}")
    order = list(range(num_records))
    if shuffle:
        random.Random(f"hybridflow-epoch:{seed}:{epoch}").shuffle(order)
    return order


def iter_epochs(
    records: list[PromptRecord], seed: int, shuffle: bool = True, start_epoch: int = 0
) -> Iterator[tuple[int, PromptRecord]]:
    """Endless (epoch, record) stream: every record once per epoch, in ``epoch_order``."""
    if not records:
        raise ValueError("records: cannot iterate epochs over an empty dataset")
    epoch = start_epoch
    while True:
        for position in epoch_order(len(records), epoch, seed, shuffle):
            yield epoch, records[position]
        epoch += 1


def _iter_rows(spec: str, num: int | None, seed: int) -> Iterator[tuple[str, Any]]:
    """(location for error messages, raw row) pairs of ``spec``."""
    if spec.startswith("builtin:"):
        if spec != "builtin:arith":
            raise ValueError(
                f"dataset {spec!r}: unknown builtin dataset; known: {BUILTIN_DATASETS}"
            )
        from hybridflow.data.arith import make_arith_rows

        rows = make_arith_rows(DEFAULT_BUILTIN_NUM if num is None else num, seed)
        return ((f"{spec} row {i}", row) for i, row in enumerate(rows))
    path = Path(spec)
    if not path.is_file():
        raise ValueError(
            f"dataset {spec!r}: no such file (expected builtin:arith, .jsonl, .parquet)"
        )
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _iter_jsonl(path)
    if suffix == ".parquet":
        return _iter_parquet(path)
    raise ValueError(f"dataset {spec!r}: unsupported file type {suffix!r} (use .jsonl or .parquet)")


def _iter_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from exc
            yield where, row


def _iter_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ImportError(
            f"reading {path} needs pyarrow: pip install pyarrow (or pip install 'hybridflow[parquet]')"
        ) from exc
    parquet_file = pq.ParquetFile(path)
    row_no = 0
    for batch in parquet_file.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            yield f"{path} row {row_no}", row
            row_no += 1


def _row_to_record(row: Any, where: str, index: int, tokenizer: Any) -> PromptRecord:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object per row, got {type(row).__name__}")
    data_source = row.get("data_source")
    if not isinstance(data_source, str) or not data_source:
        raise ValueError(
            f"{where}: field 'data_source' must be a non-empty string, got {data_source!r}"
        )
    prompt = row.get("prompt")
    if prompt is None:
        raise ValueError(f"{where}: missing field 'prompt'")
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError(f"{where}: field 'prompt' is an empty string")
        text = prompt
        ids = _encode_plain(tokenizer, text)
    elif isinstance(prompt, list):
        messages = _check_messages(prompt, where)
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"{where}: field 'prompt' is a chat message list but the tokenizer has no "
                "chat_template; use plain-string prompts or a tokenizer with a chat template"
            )
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = list(tokenizer.encode(text, add_special_tokens=False))
    else:
        raise ValueError(
            f"{where}: field 'prompt' must be a string or a list of chat messages, "
            f"got {type(prompt).__name__}"
        )
    if not ids:
        raise ValueError(f"{where}: field 'prompt' tokenises to zero tokens")
    return PromptRecord(
        prompt_text=text,
        prompt_ids=ids,
        data_source=data_source,
        ground_truth=_ground_truth(row.get("reward_model"), where),
        extra_info=_extra_info(row.get("extra_info"), where),
        index=index,
    )


def _check_messages(prompt: list[Any], where: str) -> list[dict[str, str]]:
    if not prompt:
        raise ValueError(f"{where}: field 'prompt' is an empty message list")
    for i, message in enumerate(prompt):
        if not isinstance(message, dict):
            raise ValueError(
                f"{where}: field 'prompt[{i}]' must be an object, got {type(message).__name__}"
            )
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise ValueError(
                    f"{where}: field 'prompt[{i}].{key}' must be a string, got {message.get(key)!r}"
                )
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


def _encode_plain(tokenizer: Any, text: str) -> list[int]:
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    bos = getattr(tokenizer, "bos_token_id", None)
    if getattr(tokenizer, "add_bos_token", False) and bos is not None and ids[:1] != [bos]:
        ids.insert(0, bos)
    return ids


def _ground_truth(reward_model: Any, where: str) -> str | None:
    if reward_model is None:
        return None
    if not isinstance(reward_model, dict):
        raise ValueError(
            f"{where}: field 'reward_model' must be an object, got {type(reward_model).__name__}"
        )
    truth = reward_model.get("ground_truth")
    if truth is None or isinstance(truth, str):
        return truth
    if isinstance(truth, (int, float)) and not isinstance(truth, bool):
        return str(truth)
    raise ValueError(
        f"{where}: field 'reward_model.ground_truth' must be a string or number, "
        f"got {type(truth).__name__}"
    )


def _extra_info(extra_info: Any, where: str) -> dict[str, Any]:
    if extra_info is None:
        return {}
    if not isinstance(extra_info, dict):
        raise ValueError(
            f"{where}: field 'extra_info' must be an object, got {type(extra_info).__name__}"
        )
    return dict(extra_info)
