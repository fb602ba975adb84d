"""What the resume matrices share (tests/unit/coordinator/test_resume_matrix.py, fake
services; tests/fault/test_resume_matrix_twins.py, the real learner): an ``Observer`` reads
one key's value in effect from a resumed run, ``one`` reduces many observations to the value
they agree on, and ``ObservedTable`` is the table they print (``pytest -s``) and write to a
file: each key's new value, the value the resumed run was observed to use, and where that
was read."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

Run = TypeVar("Run")

NOTHING = "(nothing observed)"


@dataclass(frozen=True)
class Observer(Generic[Run]):
    """Reads one key's value in effect from a resumed run (what its parts did)."""

    source: str
    """Where the value is read (the table's last column)."""
    read: Callable[[Run], object]


def one(values: Iterable[object]) -> object:
    """The value every observation agrees on; else all of them, distinct, in order (which
    then fails the comparison, showing them); ``NOTHING`` when there is none."""
    distinct: list[object] = []
    for value in values:
        if value not in distinct:
            distinct.append(value)
    if not distinct:
        return NOTHING
    return distinct[0] if len(distinct) == 1 else tuple(distinct)


@dataclass
class ObservedTable:
    """Rows of (case, key, new value, observed value, source), printed by ``report``."""

    title: str
    rows: list[tuple[str, str, str, str, str]] = field(default_factory=list)

    def add(self, case: str, key: str, new: object, observed: object, source: str) -> None:
        self.rows.append((case, key, _show(new), _show(observed), source))

    def render(self) -> str:
        head = ("case", "key", "new value", "observed after resume", "read from")
        lines = [f"| {' | '.join(head)} |", f"|{'---|' * len(head)}"]
        for case, key, new, observed, source in sorted(self.rows):
            shown_case = "" if case == key else case
            lines.append(f"| {shown_case} | `{key}` | {new} | {observed} | {source} |")
        return f"{self.title} ({len(self.rows)} observations)\n" + "\n".join(lines) + "\n"

    def report(self, path: Path) -> None:
        """Prints the table (nothing when no row was observed) and writes it to ``path``."""
        if not self.rows:
            return
        text = self.render()
        path.write_text(text)
        print(f"\n{text}(written to {path})")


def _show(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)
