"""``python -m hybridflow.coordinator`` is ``hybridflow-coordinator``."""

from hybridflow.coordinator.cli import exit_fast, main

exit_fast(main())
