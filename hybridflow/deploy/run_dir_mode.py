"""Who may read a run directory: its owner only (0700 directories, 0600 files) by default,
or its owner's group too (0750 / 0640) with ``deploy.group_readable``.

The mode is set by the process umask, taken before anything is created, so every file the
launcher and the processes it starts write (the services inherit the umask: checkpoints of
every learner rank, logs, the resolved config, metrics) gets it without each writer having
to care. The run directory itself is chmod-ed too, so a run first written under a looser
umask (an older version) is closed on resume. Nothing here knows what goes into the
directory.
"""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_UMASK = 0o077
GROUP_READABLE_UMASK = 0o027


def run_umask(group_readable: bool) -> int:
    """The umask for a run: others never read; the group reads when ``group_readable``."""
    return GROUP_READABLE_UMASK if group_readable else PRIVATE_UMASK


def prepare_run_dir(run_dir: Path, group_readable: bool) -> None:
    """Sets this process's umask for the run, creates ``run_dir`` (and missing parents) and
    gives it the run's mode (0700, or 0750 when group-readable)."""
    umask = run_umask(group_readable)
    os.umask(umask)
    run_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(run_dir, 0o777 & ~umask)
