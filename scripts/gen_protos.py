"""Regenerates the Python gRPC code under hybridflow/v1/ from protos/hybridflow/v1/*.proto.

Usage: python scripts/gen_protos.py [--out DIR]   (default: the repository root)
The generated files are committed; tests/unit/test_protos_fresh.py fails when they are stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "protos"


def generate(out_dir: Path) -> list[Path]:
    """Runs protoc on every .proto; returns the generated files."""
    import grpc_tools
    from grpc_tools import protoc  # dev dependency, imported only here

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    package_dir = out_dir / "hybridflow" / "v1"
    init = package_dir / "__init__.py"
    init.write_text('"""Generated gRPC code (make proto). Never edit by hand."""\n')
    return sorted(package_dir.iterdir())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO)
    args = parser.parse_args()
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
