"""Writes docs/configuration.md, the reference of every job config key, from the config
dataclasses themselves: each field's type, default and docstring (the string literal under it).

    python scripts/gen_config_docs.py           # rewrite docs/configuration.md
    python scripts/gen_config_docs.py --check   # exit 1 if it is not current

``tests/unit/config/test_config_reference.py`` fails when the page is stale or a field has no
docstring.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
PAGE = REPO / "docs" / "configuration.md"

HEADER = """# Configuration reference

Every key of the job config (`deploy/configs/*.yaml`, `--set key=value`), generated from the
config dataclasses by `python scripts/gen_config_docs.py`; do not edit by hand (a test fails
when this page is stale). A job file has one section per service; every process loads the
whole file, so a typo anywhere is refused by whichever starts first. Which keys a `--resume`
may change is `docs/resume.md`.
"""


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring written under it in ``cls``'s body (and its bases')."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def rows(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, doc) of every leaf field under ``cls``, nested ones dotted."""
    from hybridflow.config.fields import bound_of, derived_from

    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        default = _default(f)
        if dataclasses.is_dataclass(default):
            out.append((key, "section", "", docs.get(f.name, "")))
            out.extend(rows(type(default), key + "."))
            continue
        shown = "required" if default is dataclasses.MISSING else f"`{default!r}`"
        if derived_from(f):  # not a key of its own: the job config sets it
            shown = f"= `{derived_from(f)}`"
        bound = bound_of(f)
        kind = _type_name(hints[f.name]) + (f", {bound.describe()}" if bound else "")
        out.append((key, kind, shown, docs.get(f.name, "")))
    return out


def _type_name(tp: Any) -> str:
    """``int``, ``list[str]``, ``'pace' | 'greedy'`` (a Literal shows its values)."""
    if typing.get_origin(tp) is typing.Literal:
        return " | ".join(f"`{v!r}`" for v in typing.get_args(tp))
    text = tp.__name__ if isinstance(tp, type) and not typing.get_args(tp) else str(tp)
    return "`" + re.sub(r"\b(?:\w+\.)+(\w+)", r"\1", text) + "`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render() -> str:
    from hybridflow.job_config import JobConfig

    lines = [HEADER]
    table: list[str] = []
    section = ""
    for key, kind, default, doc in rows(JobConfig):
        top = key.split(".")[0]
        if kind == "section" and "." not in key:
            section = top
            lines += table
            table = []
            lines += ["", f"## `{top}`", "", _cell(doc), "", "| key | type | default | meaning |",
                      "|---|---|---|---|"]  # fmt: skip
            continue
        if "." not in key and section:
            lines += table
            table = []
            section = ""
        if not section and not table:
            table += [
                "",
                "## top level",
                "",
                "| key | type | default | meaning |",
                "|---|---|---|---|",
            ]
        if kind == "section":
            table.append(f"| `{key}` | section | | {_cell(doc)} |")
        else:
            table.append(f"| `{key}` | {_cell(kind)} | {_cell(default)} | {_cell(doc)} |")
    lines += table
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE} is stale: run python scripts/gen_config_docs.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
