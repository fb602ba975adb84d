"""``python -m hybridflow.loadgen`` = ``hybridflow-loadgen``."""

import sys

from hybridflow.loadgen.cli import main

sys.exit(main())
