"""Prompt datasets in verl's format, tokenised once: ``builtin:arith`` (every problem;
``builtin:arith:train`` without the held-out ones, ``builtin:arith:test`` those alone), the
built-in environments' ``builtin:calc``, ``builtin:guess``, reasoning-gym's tasks
(``reasoning_gym:<task>[?options]``, ``reasoning_gym.py``), verifiers tasksets
(``verifiers:<module:Taskset>[?options]``, ``verifiers_tasks.py``), JSONL and parquet, plus
ShareGPT conversations (``sharegpt:PATH``, converted to rows by ``sharegpt.py``).

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
Prompts longer than ``max_prompt_tokens`` are dropped and counted, never silently. A prompt
longer than ``max_prompt_bytes`` (UTF-8 bytes of its text, chat contents summed) is an error
naming the row, raised before tokenising; JSONL lines are read with a bounded buffer, so a
huge line is refused without being held in memory. ``check_prompt_rows`` runs the same row
checks without a tokenizer and reports every bad row (preflight uses it).
This module knows nothing about rollout, rewards or the coordinator's cursor.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridflow.arrays import TokenArray, as_tokens
from hybridflow.data.reasoning_gym import REASONING_GYM_PREFIX, parse_spec, reasoning_gym_rows
from hybridflow.data.sharegpt import SHAREGPT_PREFIX, iter_json_list, sharegpt_row
from hybridflow.data.verifiers_tasks import VERIFIERS_PREFIX, verifiers_rows
from hybridflow.types import arrays_equal

logger = logging.getLogger(__name__)

BUILTIN_DATASETS = (
    "builtin:arith",
    "builtin:arith:train",
    "builtin:arith:test",
    "builtin:code",
    "builtin:code:train",
    "builtin:code:test",
    "builtin:calc",
    "builtin:guess",
)
"""``builtin:code`` is the built-in code task (``code_task.py``: functions checked by tests in
the sandbox); ``builtin:calc`` and ``builtin:guess`` are the built-in environments' tasks
(``hybridflow.envs.builtin``): chat prompts, for multi-turn episodes."""
DEFAULT_BUILTIN_NUM = 1024
"""Rows generated for a builtin dataset when ``num`` is None."""
LINE_SLACK_BYTES = 1024 * 1024
"""JSONL lines may exceed the prompt limit by this much (other fields) plus JSON escaping."""


@dataclass(eq=False)
class PromptRecord:
    """One prompt, tokenised, with what the reward service needs to score its responses."""

    prompt_text: str
    """The text that was tokenised (chat template applied for chat prompts)."""
    prompt_ids: TokenArray
    """Token ids of ``prompt_text`` (int32; lists are converted once, here)."""
    data_source: str
    """Picks the reward scorer."""
    ground_truth: str | None
    """``reward_model.ground_truth`` as a string, None when the row has none."""
    extra_info: dict[str, Any] = field(default_factory=dict)
    """The row's ``extra_info`` (passed to user scorers)."""
    index: int = 0
    """0-based row number in the source: unique and stable (gaps where rows were dropped)."""
    task_prompt: str = ""
    """The prompt as a multi-turn environment's task: the last user message of a chat
    prompt, the string itself otherwise."""

    def __post_init__(self) -> None:
        self.prompt_ids = as_tokens(self.prompt_ids)

    __eq__ = arrays_equal


@dataclass
class PromptDataset:
    """The loaded records plus what was left out."""

    records: list[PromptRecord]
    """Kept records, in source order."""
    num_dropped_too_long: int = 0
    """Rows dropped because their prompt exceeded ``max_prompt_tokens``."""
    shortest_dropped: int | None = None
    """Tokens of the shortest dropped prompt (None: none dropped)."""


def is_generated(spec: str) -> bool:
    """A dataset made from a seed rather than read from a file (a builtin, a reasoning-gym
    task): its size is the trainer's ``data_size`` (or an eval set's ``size``)."""
    return spec.startswith(("builtin:", REASONING_GYM_PREFIX, VERIFIERS_PREFIX))


def generated_problem(spec: str) -> str | None:
    """Why a generated dataset's spec cannot make rows (an unknown builtin, a reasoning-gym
    task that does not exist or refuses its options), or None; makes one row to know."""
    if spec.startswith("builtin:"):
        if spec not in BUILTIN_DATASETS:
            return f"unknown builtin dataset {spec!r}; known: {list(BUILTIN_DATASETS)}"
        return None
    try:
        if spec.startswith(VERIFIERS_PREFIX):
            verifiers_rows(spec, 1)
        else:
            parse_spec(spec)
            reasoning_gym_rows(spec, 1, 0, chat=False)
    except ValueError as exc:
        return str(exc)
    return None


def load_prompt_dataset(
    spec: str,
    tokenizer: Any,
    num: int | None = None,
    seed: int = 0,
    max_prompt_tokens: int | None = None,
    max_prompt_bytes: int | None = None,
) -> list[PromptRecord]:
    """Records of ``spec``; over-long prompts are dropped and the count logged at WARNING.

    See ``read_prompt_dataset`` for the arguments; use it to get the dropped count as a value.
    """
    dataset = read_prompt_dataset(spec, tokenizer, num, seed, max_prompt_tokens, max_prompt_bytes)
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
    max_prompt_bytes: int | None = None,
) -> PromptDataset:
    """Load and tokenise a dataset.

    spec: one of ``BUILTIN_DATASETS``, a path to a ``.jsonl`` or ``.parquet`` file, or
        ``sharegpt:PATH`` (a ShareGPT ``.json`` list or ``.jsonl``; the first human turn of
        each is the prompt).
    num: keep at most this many records: the first ones in source order, after over-long
        prompts are dropped (None: all; a builtin dataset then generates DEFAULT_BUILTIN_NUM).
    seed: seeds the generation of builtin datasets (files are read in order; shuffle per epoch
        with ``epoch_order``).
    max_prompt_tokens: drop (and count) prompts with more tokens than this (None: keep all).
    max_prompt_bytes: a prompt text longer than this is a ValueError naming the row, raised
        before it is tokenised (None: no limit).
    """
    if num is not None and num < 0:
        raise ValueError(f"num must be >= 0 or None, got {num}")
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be >= 1 or None, got {max_prompt_tokens}")
    if max_prompt_bytes is not None and max_prompt_bytes < 1:
        raise ValueError(f"max_prompt_bytes must be >= 1 or None, got {max_prompt_bytes}")
    chat = getattr(tokenizer, "chat_template", None) is not None
    rows = _iter_rows(spec, num, seed, _line_limit(max_prompt_bytes), chat=chat)
    records: list[PromptRecord] = []
    num_dropped = 0
    shortest: int | None = None
    for index, (where, row) in enumerate(rows):
        if num is not None and len(records) >= num:
            break
        record = _row_to_record(row, where, index, tokenizer, max_prompt_bytes)
        length = len(record.prompt_ids)
        if max_prompt_tokens is not None and length > max_prompt_tokens:
            num_dropped += 1
            shortest = length if shortest is None else min(shortest, length)
            continue
        records.append(record)
    return PromptDataset(records, num_dropped_too_long=num_dropped, shortest_dropped=shortest)


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


def check_prompt_rows(
    spec: str,
    max_prompt_bytes: int | None = None,
    needs_ground_truth: Callable[[str], bool | None] | None = None,
    max_problems: int = 20,
) -> list[str]:
    """Every problem of a dataset file, without tokenising: one line each, naming the row.

    Checks that the file exists, is readable and has rows, that each row parses and has its
    fields, that prompts fit ``max_prompt_bytes``, and, through ``needs_ground_truth``
    (data_source -> True: its scorer needs a ground truth, None: no scorer at all), that the
    reward service can score it. Streams the file; stops listing after ``max_problems``.
    """
    problems: list[str] = []
    num_bad = 0
    num_rows = 0
    try:
        rows = _iter_rows(spec, None, 0, _line_limit(max_prompt_bytes), keep_going=True)
        for where, row in rows:
            num_rows += 1
            try:
                if isinstance(row, ValueError):  # a line that did not parse
                    raise row
                _, data_source, ground_truth, _ = _row_fields(row, where, max_prompt_bytes)
                need = needs_ground_truth(data_source) if needs_ground_truth else False
                if need is None:
                    raise ValueError(f"{where}: no reward scorer for data_source {data_source!r}")
                if need and ground_truth is None:
                    raise ValueError(
                        f'{where}: missing field "reward_model.ground_truth" (the '
                        f"{data_source!r} scorer needs one)"
                    )
            except ValueError as exc:
                num_bad += 1
                if len(problems) < max_problems:
                    problems.append(str(exc))
    except (ValueError, OSError) as exc:  # the file itself: missing, unreadable, corrupt
        return [*problems, str(exc)]
    if num_bad > len(problems):
        problems.append(f"{spec}: {num_bad - len(problems)} more bad rows not listed")
    if num_rows == 0:
        problems.append(f"{spec}: the dataset has no rows")
    return problems


def _line_limit(max_prompt_bytes: int | None) -> int | None:
    return None if max_prompt_bytes is None else 8 * max_prompt_bytes + LINE_SLACK_BYTES


def _iter_rows(
    spec: str,
    num: int | None,
    seed: int,
    max_line_bytes: int | None = None,
    keep_going: bool = False,
    chat: bool = False,
) -> Iterator[tuple[str, Any]]:
    """(location for error messages, raw row) pairs of ``spec``. ``chat``: the builtin data's
    prompts come as one user message each, for the tokenizer's chat template to render."""
    if spec.startswith("builtin:"):
        if spec not in BUILTIN_DATASETS:
            raise ValueError(
                f"dataset {spec!r}: unknown builtin dataset; known: {BUILTIN_DATASETS}"
            )
        rows = _builtin_rows(spec, DEFAULT_BUILTIN_NUM if num is None else num, seed, chat)
        return ((f"{spec} row {i}", row) for i, row in enumerate(rows))
    if spec.startswith(REASONING_GYM_PREFIX):
        rows = reasoning_gym_rows(spec, DEFAULT_BUILTIN_NUM if num is None else num, seed, chat)
        return ((f"{spec} row {i}", row) for i, row in enumerate(rows))
    if spec.startswith(VERIFIERS_PREFIX):
        rows = verifiers_rows(spec, DEFAULT_BUILTIN_NUM if num is None else num, chat)
        return ((f"{spec} row {i}", row) for i, row in enumerate(rows))
    if spec.startswith(SHAREGPT_PREFIX):
        return _iter_sharegpt(spec, max_line_bytes, keep_going)
    path = _readable_file(spec, spec)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _iter_jsonl(path, max_line_bytes, keep_going)
    if suffix == ".parquet":
        return _iter_parquet(path)
    raise ValueError(f"dataset {spec!r}: unsupported file type {suffix!r} (use .jsonl or .parquet)")


def _builtin_rows(spec: str, num: int, seed: int, chat: bool) -> list[dict[str, Any]]:
    """Rows of a builtin dataset. arith's and code's plain prompts become one user message for
    a chat tokenizer; the environments' rows are chat messages always (their openings)."""
    if spec.startswith(("builtin:arith", "builtin:code")):
        from hybridflow.data.arith import DEFAULT_MAX_OPERAND, make_arith_rows
        from hybridflow.data.code_task import make_code_rows

        task, _, split = spec.removeprefix("builtin:").partition(":")
        if task == "arith":
            rows = make_arith_rows(num, seed, DEFAULT_MAX_OPERAND, split or "all")
        else:
            rows = make_code_rows(num, seed, split or "all")
        if chat:
            rows = [{**row, "prompt": [{"role": "user", "content": row["prompt"]}]} for row in rows]
        return rows
    from hybridflow.envs.builtin import builtin_env_dataset

    return builtin_env_dataset(spec).make_rows(num, seed)


def _readable_file(spec: str, file: str) -> Path:
    path = Path(file)
    if not path.is_file():
        raise ValueError(
            f"dataset {spec!r}: no such file (expected {', '.join(BUILTIN_DATASETS)}, .jsonl, "
            f".parquet or {SHAREGPT_PREFIX}PATH)"
        )
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise ValueError(f"dataset {spec!r}: cannot read: {exc.strerror or exc}") from exc
    return path


def _iter_sharegpt(
    spec: str, max_line_bytes: int | None, keep_going: bool
) -> Iterator[tuple[str, Any]]:
    """Rows of a ShareGPT file (.json list or .jsonl): one verl row per conversation."""
    path = _readable_file(spec, spec[len(SHAREGPT_PREFIX) :])
    if path.suffix.lower() == ".jsonl":
        return _sharegpt_rows(_iter_jsonl(path, max_line_bytes, keep_going), keep_going)
    return _sharegpt_rows(iter_json_list(path), keep_going)


def _sharegpt_rows(
    conversations: Iterator[tuple[str, Any]], keep_going: bool
) -> Iterator[tuple[str, Any]]:
    for where, conversation in conversations:
        try:
            if isinstance(conversation, ValueError):  # a line that did not parse
                raise conversation
            yield where, sharegpt_row(conversation, where)
        except ValueError as exc:
            if not keep_going:
                raise
            yield where, exc


def _iter_jsonl(
    path: Path, max_line_bytes: int | None = None, keep_going: bool = False
) -> Iterator[tuple[str, Any]]:
    """Rows of a JSONL file; a line over ``max_line_bytes`` is refused unread (skipped in
    bounded chunks), so a huge line never sits in memory. A bad line raises ValueError, or
    with ``keep_going`` is yielded as that ValueError in place of the row."""
    limit = -1 if max_line_bytes is None else max_line_bytes + 1
    with path.open("rb") as f:
        line_no = 0
        while True:
            raw = f.readline(limit)
            if not raw:
                return
            line_no += 1
            where = f"{path}:{line_no}"
            if not raw.strip() and (max_line_bytes is None or len(raw) <= max_line_bytes):
                continue
            try:
                yield where, _parse_line(f, raw, where, max_line_bytes)
            except ValueError as exc:
                if not keep_going:
                    raise
                yield where, exc


def _parse_line(f: Any, raw: bytes, where: str, max_line_bytes: int | None) -> Any:
    if max_line_bytes is not None and len(raw) > max_line_bytes and raw[-1:] != b"\n":
        while raw and raw[-1:] != b"\n":  # skip the rest of the line in bounded reads
            raw = f.readline(1024 * 1024)
        raise ValueError(
            f"{where}: line longer than {max_line_bytes} bytes (prompt limit "
            f"coordinator.max_prompt_bytes={(max_line_bytes - LINE_SLACK_BYTES) // 8})"
        )
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}: not UTF-8: {exc.reason}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from exc


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


def _row_to_record(
    row: Any, where: str, index: int, tokenizer: Any, max_prompt_bytes: int | None = None
) -> PromptRecord:
    prompt, data_source, ground_truth, extra_info = _row_fields(row, where, max_prompt_bytes)
    if isinstance(prompt, str):
        text = prompt
        ids = _encode_plain(tokenizer, text)
    else:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"{where}: field 'prompt' is a chat message list but the tokenizer has no "
                "chat_template; use plain-string prompts or a tokenizer with a chat template"
            )
        text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        ids = list(tokenizer.encode(text, add_special_tokens=False))
    if not ids:
        raise ValueError(f"{where}: field 'prompt' tokenises to zero tokens")
    return PromptRecord(
        prompt_text=text,
        prompt_ids=as_tokens(ids),
        data_source=data_source,
        ground_truth=ground_truth,
        extra_info=extra_info,
        index=index,
        task_prompt=prompt if isinstance(prompt, str) else _last_user_content(prompt),
    )


def _last_user_content(messages: list[dict[str, Any]]) -> str:
    users = [str(m.get("content", "")) for m in messages if m.get("role") == "user"]
    return users[-1] if users else ""


def _row_fields(
    row: Any, where: str, max_prompt_bytes: int | None
) -> tuple[str | list[dict[str, str]], str, str | None, dict[str, Any]]:
    """(prompt, data_source, ground truth, extra_info) of a row, checked; no tokenizer."""
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
        checked: str | list[dict[str, str]] = prompt
        size = len(prompt.encode("utf-8"))
    elif isinstance(prompt, list):
        checked = _check_messages(prompt, where)
        size = sum(len(m["content"].encode("utf-8")) for m in checked)
    else:
        raise ValueError(
            f"{where}: field 'prompt' must be a string or a list of chat messages, "
            f"got {type(prompt).__name__}"
        )
    if max_prompt_bytes is not None and size > max_prompt_bytes:
        raise ValueError(
            f"{where}: prompt is {size} bytes, over coordinator.max_prompt_bytes={max_prompt_bytes}"
        )
    return (
        checked,
        data_source,
        _ground_truth(row.get("reward_model"), where),
        _extra_info(row.get("extra_info"), where),
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
