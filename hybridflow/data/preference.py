"""Preference and SFT datasets in TRL's formats, tokenised once: JSONL, parquet, built-ins.

Kinds and their fields (TRL's "explicit prompt" formats; an implicit prompt is not read):
- ``dpo``: ``prompt``, ``chosen``, ``rejected``;
- ``kto``: ``prompt``, ``completion``, ``label`` (a bool: True desirable);
- ``sft``: ``prompt`` and ``response`` (or ``completion``).

``prompt`` is a plain string or a list of chat messages, tokenised exactly like prompt datasets
(``hybridflow.data.datasets``: chat template with a generation prompt, or the string as-is).
A completion is a plain string (encoded without special tokens, then the tokenizer's EOS is
appended, as TRL does) or, with a chat prompt, a list of assistant messages: the completion
is what the chat template renders after the prompt (its end-of-turn tokens included).

Built-ins: ``builtin:arith_dpo``, ``builtin:arith_kto``, ``builtin:arith_sft`` (train split)
and the same names with ``:test`` (the held-out problems; see ``hybridflow.data.arith``).

Bad rows raise ValueError naming the file, the line (JSONL) or row (parquet) and the field.
This module knows nothing about models, losses or the learner.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hybridflow.arrays import TokenArray, as_tokens
from hybridflow.data.datasets import _check_messages, _encode_plain, _iter_rows

PreferenceKind = Literal["dpo", "kto", "sft"]
KINDS: tuple[str, ...] = ("dpo", "kto", "sft")
DEFAULT_BUILTIN_NUM = 512
"""Rows generated for a built-in train split when ``num`` is None (the test split: 128)."""
DEFAULT_BUILTIN_TEST_NUM = 128


@dataclass(eq=False)
class PreferencePair:
    """One DPO example, tokenised."""

    prompt_ids: TokenArray
    chosen_ids: TokenArray
    rejected_ids: TokenArray
    index: int = 0
    """0-based row number in the source."""


@dataclass(eq=False)
class LabelledCompletion:
    """One KTO example (``label`` True: desirable) or SFT example (``label`` always True)."""

    prompt_ids: TokenArray
    completion_ids: TokenArray
    label: bool = True
    index: int = 0
    """0-based row number in the source."""


PreferenceRecord = PreferencePair | LabelledCompletion


def builtin_preference_specs() -> tuple[str, ...]:
    """Every built-in preference dataset spec."""
    return tuple(f"builtin:arith_{k}{s}" for k in KINDS for s in ("", ":test"))


def read_preference_dataset(
    spec: str, tokenizer: Any, kind: str, num: int | None = None, seed: int = 0
) -> list[Any]:
    """Records of ``spec`` for ``kind``: ``PreferencePair`` (dpo) or ``LabelledCompletion``.

    num: keep the first ``num`` rows (None: all; built-ins then generate 512 train / 128 test).
    seed: seeds the generation of built-in datasets (files are read in order).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if num is not None and num < 0:
        raise ValueError(f"num must be >= 0 or None, got {num}")
    records: list[Any] = []
    for index, (where, row) in enumerate(_preference_rows(spec, kind, num, seed)):
        if num is not None and len(records) >= num:
            break
        records.append(_row_to_record(row, where, index, kind, tokenizer))
    if not records:
        raise ValueError(f"dataset {spec!r}: no rows")
    return records


def _preference_rows(spec: str, kind: str, num: int | None, seed: int) -> Any:
    if not spec.startswith("builtin:"):
        if not Path(spec).is_file():
            raise ValueError(
                f"dataset {spec!r}: no such file (expected one of "
                f"{builtin_preference_specs()}, a .jsonl or a .parquet file)"
            )
        return _iter_rows(spec, num, seed)
    name, _, split = spec.partition(":")[2].partition(":")
    builtin_kind = name.removeprefix("arith_")
    if not name.startswith("arith_") or builtin_kind not in KINDS or split not in ("", "test"):
        raise ValueError(
            f"dataset {spec!r}: unknown builtin preference dataset; "
            f"known: {builtin_preference_specs()}"
        )
    if builtin_kind != kind:
        raise ValueError(f"dataset {spec!r} holds {builtin_kind} rows, not {kind}")
    from hybridflow.data.arith import make_arith_preference_rows

    test = split == "test"
    default = DEFAULT_BUILTIN_TEST_NUM if test else DEFAULT_BUILTIN_NUM
    rows = make_arith_preference_rows(
        kind, default if num is None else num, seed, "test" if test else "train"
    )
    return ((f"{spec} row {i}", row) for i, row in enumerate(rows))


def _row_to_record(row: Any, where: str, index: int, kind: str, tokenizer: Any) -> Any:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object per row, got {type(row).__name__}")
    prompt = _field(row, "prompt", where)
    prompt_text, prompt_ids = _encode_prompt(prompt, where, tokenizer)
    if kind == "dpo":
        return PreferencePair(
            prompt_ids=prompt_ids,
            chosen_ids=_encode_completion(row, "chosen", prompt, prompt_text, where, tokenizer),
            rejected_ids=_encode_completion(row, "rejected", prompt, prompt_text, where, tokenizer),
            index=index,
        )
    if kind == "kto":
        label = _field(row, "label", where)
        if not isinstance(label, bool):
            raise ValueError(f"{where}: field 'label' must be a bool, got {label!r}")
        return LabelledCompletion(
            prompt_ids=prompt_ids,
            completion_ids=_encode_completion(
                row, "completion", prompt, prompt_text, where, tokenizer
            ),
            label=label,
            index=index,
        )
    name = "response" if "response" in row or "completion" not in row else "completion"
    return LabelledCompletion(
        prompt_ids=prompt_ids,
        completion_ids=_encode_completion(row, name, prompt, prompt_text, where, tokenizer),
        index=index,
    )


def _field(row: dict[str, Any], name: str, where: str) -> Any:
    if row.get(name) is None:
        raise ValueError(f"{where}: missing field {name!r}")
    return row[name]


def _encode_prompt(prompt: Any, where: str, tokenizer: Any) -> tuple[str, TokenArray]:
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError(f"{where}: field 'prompt' is an empty string")
        text, ids = prompt, _encode_plain(tokenizer, prompt)
    elif isinstance(prompt, list):
        messages = _check_messages(prompt, where)
        _require_chat_template(tokenizer, where, "prompt")
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = list(tokenizer.encode(text, add_special_tokens=False))
    else:
        raise ValueError(
            f"{where}: field 'prompt' must be a string or a list of chat messages, "
            f"got {type(prompt).__name__}"
        )
    if not ids:
        raise ValueError(f"{where}: field 'prompt' tokenises to zero tokens")
    return text, as_tokens(ids)


def _encode_completion(
    row: dict[str, Any], name: str, prompt: Any, prompt_text: str, where: str, tokenizer: Any
) -> TokenArray:
    value = _field(row, name, where)
    if isinstance(value, str):
        if not value:
            raise ValueError(f"{where}: field {name!r} is an empty string")
        if not isinstance(prompt, str):
            raise ValueError(
                f"{where}: field {name!r} is a string but 'prompt' is a message list; "
                "use assistant messages for conversational rows"
            )
        ids = list(tokenizer.encode(value, add_special_tokens=False))
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos is not None:
            ids.append(int(eos))
    elif isinstance(value, list):
        messages = _completion_messages(value, name, where)
        if not isinstance(prompt, list):
            raise ValueError(f"{where}: field {name!r} is a message list but 'prompt' is a string")
        full = tokenizer.apply_chat_template(
            _check_messages(prompt, where) + messages, tokenize=False
        )
        if not full.startswith(prompt_text):
            raise ValueError(
                f"{where}: field {name!r}: the chat template does not render the prompt as a "
                "prefix of prompt + completion; use plain-string rows"
            )
        ids = list(tokenizer.encode(full[len(prompt_text) :], add_special_tokens=False))
    else:
        raise ValueError(
            f"{where}: field {name!r} must be a string or a list of chat messages, "
            f"got {type(value).__name__}"
        )
    if not ids:
        raise ValueError(f"{where}: field {name!r} tokenises to zero tokens")
    return as_tokens(ids)


def _completion_messages(value: list[Any], name: str, where: str) -> list[dict[str, str]]:
    if not value:
        raise ValueError(f"{where}: field {name!r} is an empty message list")
    for i, m in enumerate(value):
        if not (
            isinstance(m, dict) and all(isinstance(m.get(k), str) for k in ("role", "content"))
        ):
            raise ValueError(
                f"{where}: field '{name}[{i}]' must be a message {{role, content}}, got {m!r}"
            )
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _require_chat_template(tokenizer: Any, where: str, name: str) -> None:
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"{where}: field {name!r} is a chat message list but the tokenizer has no "
            "chat_template; use plain strings or a tokenizer with a chat template"
        )
