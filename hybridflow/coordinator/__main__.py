"""``python -m hybridflow.coordinator`` is ``hybridflow-coordinator``; it ends like the
services do (``exit_service``: no interpreter teardown)."""

from hybridflow.coordinator.cli import main
from hybridflow.utils.fast_exit import exit_service

exit_service(main())
