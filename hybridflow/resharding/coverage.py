"""No silent drops: a transfer plan covers every parameter on both sides, or the join fails.

A learner parameter the plan does not list would never be sent; an engine parameter no
destination fills would keep its old (or initial) values. Both would pass every hash check,
since both sides plan from the same description. So at join each side compares the plan with
what it really holds: the learner with its own parameter table, a vLLM worker with the
parameters its model holds (read from the model, not from the description).

Pure: names and shapes only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hybridflow.resharding.topology import Topology

Shape = tuple[int, ...]
TableRow = tuple[str, Shape, str]


def check_learner_covered(topology: Topology, table: Sequence[TableRow]) -> None:
    """ValueError naming every learner parameter the plan leaves out (or shapes differently)
    and every planned parameter the learner lacks."""
    planned = {p.name: p.shape for p in topology.params}
    held = {name: tuple(shape) for name, shape, _ in table}
    check_same_params(planned, held, "the learner", "never be sent")


def check_same_params(
    planned: Mapping[str, Shape], held: Mapping[str, Shape], holder: str, consequence: str
) -> None:
    """ValueError naming what ``holder`` holds that is not ``planned`` (it would
    ``consequence``), what is planned but not held, and what differs in shape."""
    problems = []
    extra = sorted(set(held) - set(planned))
    if extra:
        problems.append(
            f"{holder} holds {_names(extra)}, which the transfer plan does not cover (it "
            f"would {consequence})"
        )
    missing = sorted(set(planned) - set(held))
    if missing:
        problems.append(f"the transfer plan names {_names(missing)}, which {holder} lacks")
    for name in sorted(set(planned) & set(held)):
        if tuple(planned[name]) != tuple(held[name]):
            problems.append(
                f"{name} has shape {tuple(held[name])} in {holder}, the plan says "
                f"{tuple(planned[name])}"
            )
            break
    if problems:
        raise ValueError("; ".join(problems))


def _names(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"{len(names)} parameter(s) {shown}{more}"
