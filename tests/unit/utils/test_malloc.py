"""keep_freed_memory: after it, glibc serves a large block from the heap (no mmap of its own),
in the main thread and in any other (one arena), and keeps it once freed;
HYBRIDFLOW_MALLOC=system leaves the allocator alone; a bad value is refused. Each case runs in
a child process: the setting lasts for a process's life."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"),
    reason="glibc's malloc only",
)

CHILD = textwrap.dedent(
    """
    import ctypes, json, sys, threading

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    from hybridflow.utils.malloc import keep_freed_memory, keeps_large_blocks

    applied = keep_freed_memory()
    probe = keeps_large_blocks()
    before = libc.mallinfo2()
    block = libc.malloc(64 << 20)  # over glibc's largest mmap threshold (32 MB)
    held = libc.mallinfo2()
    libc.free(block)
    freed = libc.mallinfo2()
    # The same from another thread (a service's train step runs in a gRPC worker thread):
    # glibc gives a thread an arena of its own, whose blocks over 64 MB are mmapped anyway.
    in_thread = {}
    def allocate_in_a_thread():
        start = libc.mallinfo2()
        block = libc.malloc(96 << 20)
        in_thread["mmapped"] = libc.mallinfo2().hblkhd - start.hblkhd
        libc.free(block)
    thread = threading.Thread(target=allocate_in_a_thread)
    thread.start()
    thread.join()
    print(json.dumps({
        "mmapped_by_thread_block": in_thread["mmapped"],
        "applied": applied,
        "probe_says_kept": probe,
        "again": keep_freed_memory(),
        "mmapped_by_block": held.hblkhd - before.hblkhd,
        "heap_while_held": held.arena,
        "heap_after_free": freed.arena,
        "free_in_heap_after_free": freed.fordblks,
    }))
    """
)


def run_child(
    env_value: str | None, ranks: int | None = None, tunables: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("HYBRIDFLOW_MALLOC", None)
    env.pop("LOCAL_WORLD_SIZE", None)
    env.pop("GLIBC_TUNABLES", None)
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    if env_value is not None:
        env["HYBRIDFLOW_MALLOC"] = env_value
    if ranks is not None:
        env["LOCAL_WORLD_SIZE"] = str(ranks)
    return subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def figures(
    env_value: str | None, ranks: int | None = None, tunables: str | None = None
) -> dict[str, int]:
    done = run_child(env_value, ranks, tunables)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kept_block_comes_from_the_heap_and_stays_there_freed() -> None:
    got = figures(None)
    assert got["applied"] is True and got["again"] is True
    assert got["probe_says_kept"] is True
    assert got["mmapped_by_block"] == 0
    assert got["mmapped_by_thread_block"] == 0  # one arena: every thread's blocks in the heap
    assert got["heap_while_held"] >= 64 << 20
    # freed, it stays in the heap for the next allocation instead of going back to the kernel
    assert got["heap_after_free"] >= 64 << 20
    assert got["free_in_heap_after_free"] >= 64 << 20


def test_system_keeps_glibc_defaults() -> None:
    got = figures("system")
    assert got["applied"] is False
    assert got["probe_says_kept"] is False
    assert got["mmapped_by_block"] >= 64 << 20  # glibc's own mmap for a block this large
    assert got["mmapped_by_thread_block"] >= 96 << 20
    assert got["heap_after_free"] < 64 << 20


def test_keep_is_what_unset_means() -> None:
    asked = figures("keep")
    assert asked["applied"] is True and asked["mmapped_by_block"] == 0
    assert asked["mmapped_by_thread_block"] == 0


def test_ranks_sharing_a_host_keep_glibc_defaults_unless_asked() -> None:
    # Each would hold its own peak: two 0.5B-shape FSDP ranks beside vLLM did not fit 23 GB.
    shared = figures(None, ranks=2)
    assert shared["applied"] is False and shared["mmapped_by_block"] >= 64 << 20
    alone = figures(None, ranks=1)
    assert alone["applied"] is True and alone["mmapped_by_block"] == 0
    asked = figures("keep", ranks=2)
    assert asked["applied"] is True and asked["mmapped_by_block"] == 0


def test_a_child_started_afresh_keeps_freed_memory_through_the_tunables(monkeypatch) -> None:
    """A spawned process (vLLM's CPU workers) does not inherit mallopt's settings; the
    tunables ``child_tunables`` gives (with ``HYBRIDFLOW_MALLOC=keep``) do the same from its
    first malloc. The child here
    leaves mallopt alone (``system``): what it keeps, it keeps through the tunables."""
    from hybridflow.utils import malloc

    monkeypatch.setenv("HYBRIDFLOW_MALLOC", "keep")
    monkeypatch.setattr(malloc, "_applied", False)
    assert malloc.child_tunables("") is None  # nothing to pass on where it did not apply
    monkeypatch.setattr(malloc, "_applied", True)
    monkeypatch.delenv("HYBRIDFLOW_MALLOC")
    assert malloc.child_tunables("") is None  # such children hold their own peak: asked only
    monkeypatch.setenv("HYBRIDFLOW_MALLOC", "keep")
    tunables = malloc.child_tunables("")
    assert tunables is not None
    got = figures("system", tunables=tunables)
    assert got["applied"] is False  # mallopt not called in the child
    assert got["probe_says_kept"] is True
    assert got["mmapped_by_block"] == 0
    assert got["mmapped_by_thread_block"] == 0
    assert got["heap_after_free"] >= 64 << 20
    assert got["free_in_heap_after_free"] >= 64 << 20
    # Without them the same child maps and unmaps the block (the case the tunables fix).
    plain = figures("system", tunables="")
    assert plain["mmapped_by_block"] >= 64 << 20
    assert plain["probe_says_kept"] is False


def test_a_bad_value_is_refused_with_its_name() -> None:
    done = run_child("jemalloc")
    assert done.returncode != 0
    assert "HYBRIDFLOW_MALLOC='jemalloc'" in done.stderr


# A service's first thread (deploy/launch.sh's lifeline watchdog, started when the launcher's
# pid is in the environment) must come after the allocator setting: a thread that allocates
# before it keeps an arena of its own, which glibc then hands to gRPC's workers too, and the
# train step's large blocks are mmapped and unmapped every micro-batch again.
SERVICE_CHILD = textwrap.dedent(
    """
    import json, os, sys, threading

    import hybridflow.utils.malloc as malloc

    seen = {}
    keep = malloc.keep_freed_memory

    def recording_keep():
        seen.setdefault("threads_at_keep", malloc.other_threads())
        return keep()

    def first_start(thread):
        seen["applied_at_first_thread"] = malloc._applied
        seen["first_thread"] = thread.name
        print(json.dumps(seen), flush=True)
        os._exit(0)

    malloc.keep_freed_memory = recording_keep
    threading.Thread.start = first_start
    module, argv = sys.argv[1], sys.argv[2:]
    __import__(module, fromlist=["main"]).main(argv)
    print(json.dumps(seen), flush=True)  # no thread started: main returned
    """
)
REWARD_MODEL_JOB = """\
reward:
  components:
    - {name: rm, kind: model, model: builtin:tiny-rm}
"""


@pytest.mark.parametrize("service", ["learner", "rollout", "reward"])
def test_a_service_sets_the_allocator_before_its_first_thread(service: str, tmp_path: Path) -> None:
    config = REPO / "deploy" / "configs" / "quickstart.yaml"
    if service == "reward":  # torch (and the setting) only with a reward model
        config = tmp_path / "job.yaml"
        config.write_text(REWARD_MODEL_JOB)
    env = dict(os.environ, HYBRIDFLOW_LAUNCHER_PID=str(os.getpid()))
    env.pop("HYBRIDFLOW_MALLOC", None)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            SERVICE_CHILD,
            f"hybridflow.main.{service}",
            "--config",
            str(config),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["first_thread"] == "launcher-lifeline"
    assert seen["applied_at_first_thread"] is True
    assert seen["threads_at_keep"] == []  # no thread of any kind (torch's own) before it
