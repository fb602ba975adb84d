"""The weight-sync group's arrival check, over a real TCPStore in one process: a refusal
reported on one rank ends the wait on every rank with that reason; a rank that never comes is
named; when all arrive, nobody waits."""

from __future__ import annotations

import datetime
import threading

import pytest
import torch.distributed as dist

from hybridflow.weights.transport.group import arrive


@pytest.fixture
def store() -> dist.Store:
    server = dist.TCPStore(
        "127.0.0.1", 0, None, is_master=True, timeout=datetime.timedelta(seconds=30),
        wait_for_workers=False,
    )  # fmt: skip
    return dist.PrefixStore("g/", server)


def test_a_refusal_on_rank_0_ends_every_rank_s_wait(store: dist.Store) -> None:
    errors: list[BaseException] = []

    def waiting_rank() -> None:
        try:
            arrive(store, 1, 3, timeout_s=30)
        except BaseException as exc:  # noqa: BLE001 — checked below
            errors.append(exc)

    thread = threading.Thread(target=waiting_rank)
    thread.start()
    with pytest.raises(RuntimeError, match="abandoned: replica b refused to join: no"):
        arrive(store, 0, 3, 30, lambda: "replica b refused to join: no")
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert [str(e) for e in errors] == [
        "weight-sync group abandoned: replica b refused to join: no"
    ]


def test_a_missing_rank_is_named_after_the_timeout(store: dist.Store) -> None:
    with pytest.raises(TimeoutError, match=r"ranks \[1, 2\] did not join within 0s"):
        arrive(store, 0, 3, timeout_s=0)


def test_nobody_waits_once_all_have_arrived(store: dist.Store) -> None:
    threads = [threading.Thread(target=arrive, args=(store, r, 3, 30)) for r in (1, 2)]
    for t in threads:
        t.start()
    arrive(store, 0, 3, timeout_s=30)
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive()
