"""``python -m hybridflow.preference --config job.yaml --run-dir DIR``: the offline job."""

import sys

from hybridflow.preference.cli import main

if __name__ == "__main__":
    sys.exit(main())
