"""The committed generated code matches the .proto files (run `make proto` when this fails)."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_generated_code_is_up_to_date(tmp_path):
    spec = importlib.util.spec_from_file_location("gen_protos", REPO / "scripts" / "gen_protos.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_protos"] = module
    spec.loader.exec_module(module)
    fresh = {p.name: p.read_text() for p in module.generate(tmp_path)}
    committed_dir = REPO / "hybridflow" / "v1"
    committed = {p.name: p.read_text() for p in committed_dir.iterdir() if p.is_file()}
    stale = sorted(name for name in fresh if committed.get(name) != fresh[name])
    assert not stale, f"stale generated files (run `make proto`): {stale}"
    extra = sorted(set(committed) - set(fresh))
    assert not extra, f"generated files without a .proto: {extra}"


def test_every_field_has_a_comment():
    import re

    for proto in (REPO / "protos").rglob("*.proto"):
        lines = proto.read_text().splitlines()
        for i, line in enumerate(lines):
            field = re.match(r"\s*(repeated\s+|optional\s+)?[\w.]+\s+\w+\s*=\s*\d+;", line)
            if field and "oneof" not in line:
                assert lines[i - 1].strip().startswith("//"), f"{proto.name}:{i + 1} has no comment"
