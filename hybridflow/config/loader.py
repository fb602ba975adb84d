"""Strict YAML → dataclass loader shared by every service and the coordinator.

Unknown keys are errors naming the key and the file; values are checked against the field
types; ``--set a.b=c`` overrides are applied before validation (the value is parsed as YAML,
so ``--set coordinator.num_steps=5`` gives an int). A key a section has renamed (its class's
``RENAMED_KEYS``: old name -> new dotted name, relative to the section) still loads, moved to
its new place, with one notice line naming the new key. A field declared ``derived`` (from
``config.fields``) is filled in from its source key; an old file that still sets it loads when
the two are equal (one notice) and is refused when they differ. A section's ``upgrade_raw``
classmethod, when it has one, rewrites an old form of a value (a comma-separated string
where a list is now expected) and names the keys it rewrote, one notice each.
``with_overrides`` applies further overrides to a config already loaded, without reading its
file again. This module imports neither torch nor grpc, and knows nothing of which service it configures.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from hybridflow.config.fields import derived_from

T = TypeVar("T")
log = logging.getLogger(__name__)
_noticed: set[str] = set()


class ConfigError(ValueError):
    """A config file or override that does not fit its dataclass."""


def load_config(
    cls: type[T],
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    section: str | None = None,
) -> T:
    """Builds ``cls`` from a YAML file (optionally one top-level section) plus overrides."""
    source = config_source(path)
    raw: dict[str, Any] = {}
    if path is not None:
        file_path = Path(path)
        if not file_path.is_file():
            raise ConfigError(f"config file not found: {file_path}")
        loaded = yaml.safe_load(file_path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{source}: top level must be a mapping, got {type(loaded).__name__}")
        raw = loaded
    if section is not None:
        sub = raw.get(section, {}) or {}
        if not isinstance(sub, dict):
            raise ConfigError(f"{source}: section '{section}' must be a mapping")
        raw = sub
    for override in overrides:
        apply_override(raw, override, cls)
    return from_dict(cls, raw, source=source)


def config_source(path: str | Path | None) -> str:
    """How errors name a config's origin: its file, or ``<defaults>`` when it has none."""
    return str(path) if path is not None else "<defaults>"


def with_overrides(obj: T, overrides: Sequence[str], source: str = "<code>") -> T:
    """The loaded config dataclass ``obj`` with ``--set`` style ``overrides`` applied by
    ``apply_override`` and checked again as ``from_dict`` checks, errors naming ``source``
    (``config_source`` of the file ``obj`` came from): the config, validation and messages of
    loading that file with the overrides appended, without reading it again. Derived fields
    are left out before the overrides, so each is derived again from its (maybe overridden)
    source with no notice."""
    cls = type(obj)
    raw = _without_derived(cls, to_dict(obj))
    for override in overrides:
        apply_override(raw, override, cls)
    return from_dict(cls, raw, source)


def _without_derived(cls: type, raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` (``to_dict`` of a ``cls``) less every derived field that ``derive_keys`` sets
    again from its source, at every level; changed in place and returned."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        sub, section = hints.get(f.name), raw.get(f.name)
        if not (isinstance(sub, type) and dataclasses.is_dataclass(sub)):
            continue
        if not isinstance(section, dict):
            continue
        for g in dataclasses.fields(sub):
            origin = derived_from(g)
            if origin and _source_value(cls, raw, origin, "<dict>") is not _MISSING:
                section.pop(g.name, None)
        _without_derived(sub, section)
    return raw


def apply_override(raw: dict[str, Any], override: str, cls: type | None = None) -> None:
    """Applies one ``dotted.key=value`` override in place; the value is parsed as YAML. With
    ``cls`` (the dataclass ``raw`` configures), a key a section has renamed is set under its
    new name (one notice), so it overrides the file's value whichever name the file uses."""
    key, sep, text = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override must look like key.sub=value, got {override!r}")
    parts = key.strip().split(".")
    if cls is not None:
        parts = current_key(cls, parts)
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: '{part}' is not a mapping")
        node = child
    node[parts[-1]] = yaml.safe_load(text) if text.strip() else ""


def from_dict(cls: type[T], data: Mapping[str, Any], source: str = "<dict>", prefix: str = "") -> T:
    """Builds dataclass ``cls`` from a mapping, strictly."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls} is not a dataclass")
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: '{prefix.rstrip('.') or '<root>'}' must be a mapping")
    data = _move_renamed(cls, data, source, prefix)
    data = derive_keys(cls, data, source, prefix)
    data = _upgrade(cls, data, prefix)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        name = prefix + unknown[0]
        raise ConfigError(
            f"{source}: unknown key '{name}' (known keys here: {', '.join(sorted(fields))})"
        )
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        kwargs[name] = _convert(hints[name], value, source, prefix + name)
    try:
        obj = cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        raise ConfigError(f"{source}: {prefix.rstrip('.') or cls.__name__}: {exc}") from exc
    validate = getattr(obj, "validate", None)
    if callable(validate):
        try:
            validate()
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from exc
    return obj


def with_keys(obj: T, keys: Mapping[str, Any], source: str = "<code>") -> T:
    """The config dataclass ``obj`` with ``keys`` set as a job file would set them: a mapping
    merges into its section, an old (renamed) key moves to its new place with one notice, and
    the result is checked as ``from_dict`` checks."""
    cls = type(obj)
    moved = _move_renamed(cls, keys, source, "")
    return from_dict(cls, _merge(to_dict(obj), moved), source)  # type: ignore[return-value]


def _merge(base: Mapping[str, Any], keys: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in keys.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def current_key(cls: type, parts: list[str]) -> list[str]:
    """The dotted key ``parts`` under dataclass ``cls`` with every renamed (old) key on its way
    replaced by its new name, one notice each; a key no section renamed comes back as it is."""
    out: list[str] = []
    node: type | None = cls
    rest = list(parts)
    while rest:
        section = node if node is not None and dataclasses.is_dataclass(node) else None
        renames = renamed_keys(section) if section is not None else {}
        if rest[0] in renames:
            new = renames[rest[0]].split(".")
            _notice(
                f"config: '{'.'.join([*out, rest[0]])}' is now '{'.'.join([*out, *new])}'"
                " (the old key still works, for now)"
            )
            rest = [*new, *rest[1:]]
        part = rest.pop(0)
        out.append(part)
        known = {f.name for f in dataclasses.fields(section)} if section is not None else set()
        hint = typing.get_type_hints(section).get(part) if part in known else None
        node = hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None
    return out


def renamed_keys(cls: type) -> dict[str, str]:
    """Old key -> new dotted key (both relative to ``cls``'s section) of a config section."""
    return dict(getattr(cls, "RENAMED_KEYS", {}) or {})


def _move_renamed(
    cls: type, data: Mapping[str, Any], source: str, prefix: str
) -> Mapping[str, Any]:
    """``data`` with each old key of ``cls`` moved to its new place, one notice per key."""
    renames = renamed_keys(cls)
    if not isinstance(data, Mapping) or not renames.keys() & data.keys():
        return data
    moved: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in data.items()}
    for old, new in renames.items():
        if old not in moved:
            continue
        value = moved.pop(old)
        *parents, leaf = new.split(".")
        node = moved
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{source}: '{prefix}{part}' must be a mapping")
            node[part] = child = dict(child)
            node = child
        if leaf in node:
            raise ConfigError(
                f"{source}: both '{prefix}{old}' and its new name '{prefix}{new}' are set; "
                f"keep '{prefix}{new}'"
            )
        node[leaf] = value
        _notice(
            f"config: '{prefix}{old}' is now '{prefix}{new}' (the old key still works, for now)"
        )
    return moved


def derive_keys(
    cls: type, data: Mapping[str, Any], source: str = "<dict>", prefix: str = ""
) -> Mapping[str, Any]:
    """``data`` with every derived field of ``cls``'s sections set from its source key (read
    from ``data``, else the source field's default). A value the file gives itself must equal
    the source's: one notice, else ConfigError. A source ``cls`` does not hold (a section
    loaded on its own), or one whose value is itself invalid, is left to the normal checks."""
    if not isinstance(data, Mapping):
        return data
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] | None = None
    for f in dataclasses.fields(cls):
        sub = hints.get(f.name)
        section = data.get(f.name) or {}
        if not (isinstance(sub, type) and dataclasses.is_dataclass(sub)):
            continue
        if not isinstance(section, Mapping):
            continue
        sub_hints = typing.get_type_hints(sub)
        for g in dataclasses.fields(sub):
            origin = derived_from(g)
            if not origin:
                continue
            value = _source_value(cls, data, origin, source)
            if value is _MISSING:
                continue
            key, origin_key = f"{prefix}{f.name}.{g.name}", f"{prefix}{origin}"
            if g.name in section:
                given = _convert(sub_hints[g.name], section[g.name], source, key)
                if not _same(given, value):
                    raise ConfigError(
                        f"{source}: '{key}' is taken from '{origin_key}' ({value!r}) and "
                        f"cannot differ from it, got {given!r}: drop '{key}'"
                    )
                _notice(
                    f"config: '{key}' is now taken from '{origin_key}' (the old key still "
                    "works while the two are equal)"
                )
            out = dict(data) if out is None else out
            out[f.name] = section = {**section, g.name: value}
    return data if out is None else out


_MISSING = object()


def _source_value(cls: type, data: Mapping[str, Any], path: str, source: str) -> Any:
    """The value at dotted ``path`` under ``cls``: the raw one (converted to the field's type),
    else the default; ``_MISSING`` when ``cls`` has no such field or the raw value is bad."""
    node: Any = data
    for i, part in enumerate(parts := path.split(".")):
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            return _MISSING
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if part not in fields:
            return _MISSING
        if not (isinstance(node, Mapping) and part in node):
            value: Any = _field_default(fields[part])
            for rest in parts[i + 1 :]:
                value = getattr(value, rest, _MISSING)
            return value
        node, cls = node[part], typing.get_type_hints(cls)[part]
    try:
        return _convert(cls, node, source, path)
    except ConfigError:
        return _MISSING


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return _MISSING


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= 1e-9
    return bool(a == b)


def _upgrade(cls: type, data: Mapping[str, Any], prefix: str) -> Mapping[str, Any]:
    """``data`` after the section's ``upgrade_raw`` (old forms of values), one notice a key."""
    upgrade = getattr(cls, "upgrade_raw", None)
    if not callable(upgrade) or not isinstance(data, Mapping):
        return data
    new = dict(data)
    for key, note in upgrade(new):
        _notice(f"config: '{prefix}{key}' {note}")
    return new


def _notice(line: str) -> None:
    if line not in _noticed:
        _noticed.add(line)
        log.warning(line)


def _convert(tp: Any, value: Any, source: str, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, source, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{source}: '{key}' has an invalid value")
    if origin is typing.Literal:
        if isinstance(value, bool) and value not in args:
            value = _yaml11_word(value, args)  # YAML 1.1 reads off/on/no/yes as bools
        if value not in args:
            raise ConfigError(f"{source}: '{key}' must be one of {list(args)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return from_dict(tp, value if value is not None else {}, source, key + ".")
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{source}: '{key}' must be a list, got {value!r}")
        item_tp = args[0] if args else Any
        items = [_convert(item_tp, v, source, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple or tp is tuple else items
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: '{key}' must be a mapping, got {value!r}")
        val_tp = args[1] if len(args) == 2 else Any
        return {str(k): _convert(val_tp, v, source, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: '{key}' must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{source}: '{key}' must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):
            value = _yaml11_float(value)  # YAML 1.1 reads "2e-4" (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{source}: '{key}' must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{source}: '{key}' must be a string, got {value!r}")
        return value
    return value


def to_dict(obj: Any) -> Any:
    """A dataclass config as plain YAML-able data (for the resolved config of a run)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def dump_yaml(obj: Any, path: str | Path) -> None:
    """Writes a config (dataclass) as YAML."""
    Path(path).write_text(yaml.safe_dump(to_dict(obj), sort_keys=False))


def _yaml11_float(text: str) -> float | str:
    """``text`` as a float when it is an exponent number YAML 1.1 leaves a string ("2e-4",
    "1E5"); anything else is returned unchanged (and refused by the caller)."""
    try:
        number = float(text)
    except ValueError:
        return text
    return number if "e" in text.lower() and math.isfinite(number) else text


def _yaml11_word(value: bool, allowed: tuple[Any, ...]) -> Any:
    """The word of ``allowed`` YAML 1.1 turned into ``value`` ("off" for a Literal of
    "auto" / "off"); ``value`` unchanged when none is there."""
    words = ("on", "yes", "true") if value else ("off", "no", "false")
    for word in words:
        for option in allowed:
            if isinstance(option, str) and option.lower() == word:
                return option
    return value
