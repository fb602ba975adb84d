"""Config fields that carry their own bounds, declared once where the field is.

    lr: float = knob(1e-5, gt=0)
    devices: str = knob("", free="device list, checked when the service starts")

``knob`` is ``dataclasses.field`` plus the bound (``ge`` / ``gt`` / ``le`` / ``lt``,
``finite=True`` for any finite number, or ``choices`` for a list of names) in the field's
metadata; ``free=`` says why a field has none. ``field_problems(obj, "learner")`` checks every bound of one section and returns the
problem lines ``ranges.raise_problems`` joins, so a ``validate()`` holds only the checks
between fields. The type is the bound of bools, ``Literal``s and nested sections (the loader
enforces those); every other field must have a bound or a reason, which
``tests/unit/config/test_field_bounds.py`` checks for every section. No torch, no grpc.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

BOUND = "bound"
FREE = "free"
DERIVED = "derived"


@dataclass(frozen=True)
class Bound:
    """The values one field may take: a range for numbers (each end optional; with neither,
    ``finite`` says any finite number), or a set of names for a string or a list of strings.
    ``None`` passes when the field's type allows it. NaN and infinities fail every range."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    finite: bool = False
    choices: tuple[str, ...] = ()

    def problem(self, key: str, value: Any) -> str | None:
        """The problem line of ``value`` at ``key``, or None when it is in bounds."""
        if value is None:
            return None
        if self.choices:
            items = value if isinstance(value, (list, tuple)) else [value]
            bad = [v for v in items if v not in self.choices]
            if bad:
                return f"{key}: unknown {bad[0]!r}; known: {', '.join(self.choices)}"
            return None
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                line = self.problem(f"{key}[{i}]", item)
                if line:
                    return line
            return None
        if not _number(value) or not self._holds(float(value)):
            return f"{key}: must be {self.describe()}, got {value}"
        return None

    def _holds(self, x: float) -> bool:
        return (
            (self.ge is None or x >= self.ge)
            and (self.gt is None or x > self.gt)
            and (self.le is None or x <= self.le)
            and (self.lt is None or x < self.lt)
        )

    def describe(self) -> str:
        """The bound in words: ``>= 1``, ``in (0, 1]``, ``one of a, b``."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        low = self.ge if self.ge is not None else self.gt
        high = self.le if self.le is not None else self.lt
        if low is not None and high is not None:
            opening = "[" if self.ge is not None else "("
            closing = "]" if self.le is not None else ")"
            return f"in {opening}{_fmt(low)}, {_fmt(high)}{closing}"
        if low is not None:
            return f"{'>=' if self.ge is not None else '>'} {_fmt(low)}"
        if high is not None:
            return f"{'<=' if self.le is not None else '<'} {_fmt(high)}"
        return "a finite number"


def knob(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    finite: bool = False,
    choices: Sequence[str] = (),
    free: str = "",
) -> Any:
    """A dataclass field with its bound; ``free`` instead names why it has none."""
    bound = Bound(ge=ge, gt=gt, le=le, lt=lt, finite=finite, choices=tuple(choices))
    has_bound = bound != Bound()
    if has_bound == bool(free):
        raise TypeError(
            "knob() needs a bound (ge/gt/le/lt/finite/choices) or free='reason', not both"
        )
    metadata = {BOUND: bound} if has_bound else {FREE: free}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def derived(default: Any, source: str, **bound: Any) -> Any:
    """A field the job config sets from another key (``source``, dotted from the job's root,
    e.g. ``coordinator.sampling.temperature``), so the two cannot disagree: the loader fills it
    in; a job file that still sets it loads when its value equals the source's (one notice)
    and is refused otherwise. ``bound`` as ``knob``'s (checked like any field's)."""
    made = knob(default, **bound)
    return dataclasses.field(default=default, metadata={**made.metadata, DERIVED: source})


def derived_from(f: dataclasses.Field[Any]) -> str | None:
    """The key a derived field is set from, None for an ordinary field."""
    return f.metadata.get(DERIVED)


def field_problems(obj: Any, prefix: str, skip: Collection[str] = ()) -> Iterator[str | None]:
    """The problem line (or None) of every bounded field of the dataclass ``obj``, each key
    named ``prefix.field`` (``field`` when ``prefix`` is empty: a top-level config), and of
    every ``Literal`` field (so a config built in code is held to its type too). Fields named
    in ``skip`` are not checked (ones that do not apply to this value of another field).
    Nested sections check themselves in their own ``validate()``."""
    literals = _literal_fields(type(obj))  # type: ignore[arg-type]
    for f in dataclasses.fields(obj):
        if f.name in skip:
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        bound = f.metadata.get(BOUND)
        value = getattr(obj, f.name)
        if bound is not None:
            yield bound.problem(key, value)
        elif f.name in literals and value not in literals[f.name]:
            names = ", ".join(str(v) for v in literals[f.name])
            yield f"{key}: must be one of {names}, got {value!r}"


@functools.cache
def _literal_fields(cls: type) -> dict[str, tuple[Any, ...]]:
    """Field name -> allowed values of each field typed as a Literal (or Optional of one)."""
    out: dict[str, tuple[Any, ...]] = {}
    for name, tp in typing.get_type_hints(cls).items():
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            inner = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(inner) == 1 and typing.get_origin(inner[0]) is typing.Literal:
                out[name] = (*typing.get_args(inner[0]), None)
        elif typing.get_origin(tp) is typing.Literal:
            out[name] = typing.get_args(tp)
    return out


def bound_of(f: dataclasses.Field[Any]) -> Bound | None:
    """The field's declared bound, None when it has none."""
    return f.metadata.get(BOUND)


def typed_bound(tp: Any) -> bool:
    """True when the type alone bounds the value: bool, a Literal, a nested config section
    (or an Optional / list of one of these)."""
    origin = typing.get_origin(tp)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if tp is bool or origin is typing.Literal:
        return True
    if dataclasses.is_dataclass(tp):
        return True
    if origin is not None and args and origin is not dict:
        return all(typed_bound(a) for a in args)
    return False


def _number(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else str(x)
