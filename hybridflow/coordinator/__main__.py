"""``python -m hybridflow.coordinator`` is ``hybridflow-coordinator``."""

import sys

from hybridflow.coordinator.cli import main

sys.exit(main())
