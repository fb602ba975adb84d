"""The Tinker-compatible service as a test starts it: a real process on a loopback port, with
its keys and its state folder; shared by the integration and e2e tests."""

from __future__ import annotations

import contextlib
import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

BASE = "builtin:tiny-qwen3"


@contextlib.contextmanager
def running(
    folder: Path, keys: Mapping[str, str], *extra: str
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """The service on ``folder``'s keys file and state folder: its base URL and process
    (killed when the block ends)."""
    keys_file = folder / "keys"
    keys_file.write_text("".join(f"{owner} {key}\n" for owner, key in keys.items()))
    env = {k: v for k, v in os.environ.items() if k != "HYBRIDFLOW_TOKEN"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hybridflow.services.tinker", "--model", BASE, "--port", "0"]
        + ["--keys-file", str(keys_file), "--poll-seconds", "5"]
        + ["--state-dir", str(folder / "state"), *extra],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 300
        line = ""
        while "listening on" not in line:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([proc.stdout], [], [], max(left, 0))
            assert ready and proc.poll() is None, "the tinker service did not come up"
            line = proc.stdout.readline()
        match = re.search(r"(https?://\S+)", line)
        assert match is not None
        yield match.group(1), proc
    finally:
        proc.kill()
        proc.wait(timeout=60)
