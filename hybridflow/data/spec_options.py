"""``prefix:name?key=value&...`` dataset specs (reasoning-gym tasks, verifiers tasksets): the
name and its options, each value read as YAML so numbers, booleans and lists keep their type.
No URL decoding: a ``+`` stays a plus."""

from __future__ import annotations

from typing import Any

import yaml


def split_spec(spec: str, prefix: str, example: str) -> tuple[str, dict[str, Any]]:
    """(name, options) of ``prefix:name[?key=value&...]``; ValueError naming the spec."""
    body = spec.removeprefix(prefix)
    name, _, query = body.partition("?")
    if not name:
        raise ValueError(f"dataset {spec!r}: name {example}")
    options: dict[str, Any] = {}
    for pair in query.split("&") if query else []:
        key, eq, raw = pair.partition("=")
        if not key or not eq:
            raise ValueError(f"dataset {spec!r}: option {pair!r} is not key=value")
        try:
            options[key] = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError as exc:
            raise ValueError(f"dataset {spec!r}: option {key}={raw!r} is not a value") from exc
    return name, options
