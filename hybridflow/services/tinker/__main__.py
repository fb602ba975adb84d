"""``python -m hybridflow.services.tinker``: the Tinker-compatible service (docs/tinker.md)."""

from __future__ import annotations

import sys

from hybridflow.services.tinker.server import main

if __name__ == "__main__":
    sys.exit(main())
