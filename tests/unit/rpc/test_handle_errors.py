"""Every servicer method answers: any exception, ``BaseException`` subclasses included, becomes
a status at once; a disk-full error names the path and the free space; a status the method
set with ``context.abort`` is kept; ``KeyboardInterrupt`` and friends propagate."""

from __future__ import annotations

import errno
from concurrent import futures

import grpc
import pytest

from hybridflow.errors import CheckpointCorrupt, CheckpointRejected
from hybridflow.rpc.errors import handle_errors


class Aborted(Exception):
    """What the fake context raises (gRPC's raises a bare ``Exception()``)."""


class FakeContext:
    def __init__(self, bare: bool = True) -> None:
        self._code: grpc.StatusCode | None = None
        self.details = ""
        self.calls = 0
        self._bare = bare

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.calls += 1
        self._code, self.details = code, details
        raise Exception() if self._bare else Aborted()  # noqa: TRY002 — as gRPC does


class CheckpointLikeError(BaseException):
    """Like torch.distributed.checkpoint's CheckpointException: not an Exception."""


def _status(error: BaseException) -> tuple[grpc.StatusCode | None, str]:
    class Servicer:
        @handle_errors
        def Call(self, request: object, context: FakeContext) -> None:
            raise error

    context = FakeContext()
    with pytest.raises(Exception):  # noqa: B017 — the abort's bare Exception
        Servicer().Call(None, context)
    return context.code(), context.details


def test_a_base_exception_subclass_is_answered_internal_naming_it():
    code, details = _status(CheckpointLikeError("rank 0: shard missing"))
    assert code == grpc.StatusCode.INTERNAL
    assert details == "CheckpointLikeError: rank 0: shard missing"


@pytest.mark.parametrize(
    ("error", "want"),
    [
        (CheckpointCorrupt("x/__0_0.distcp: missing"), grpc.StatusCode.DATA_LOSS),
        (
            CheckpointRejected("actor.model.w: (4, 3) here, (8, 3) saved"),
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
        (ValueError("bad"), grpc.StatusCode.INVALID_ARGUMENT),
        (FileNotFoundError("gone"), grpc.StatusCode.NOT_FOUND),
    ],
)
def test_checkpoint_refusals_have_their_own_codes(error, want):
    code, details = _status(error)
    assert code == want and details == str(error)


def test_disk_full_is_resource_exhausted_naming_path_and_free_space(tmp_path):
    target = tmp_path / "ckpt" / "__0_0.distcp"
    code, details = _status(OSError(errno.ENOSPC, "No space left on device", str(target)))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(target) in details and "MiB free" in details and "No space left" in details


def test_a_status_set_by_context_abort_is_kept():
    class Servicer:
        @handle_errors
        def Call(self, request: object, context: FakeContext) -> None:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "no")

    context = FakeContext()
    with pytest.raises(Exception):  # noqa: B017
        Servicer().Call(None, context)
    assert context.code() == grpc.StatusCode.PERMISSION_DENIED and context.calls == 1


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(3), GeneratorExit()])
def test_interpreter_exits_propagate(error):
    class Servicer:
        @handle_errors
        def Call(self, request: object, context: FakeContext) -> None:
            raise error

        @handle_errors
        def Stream(self, request: object, context: FakeContext):
            yield 1
            raise error

    context = FakeContext()
    with pytest.raises(type(error)):
        Servicer().Call(None, context)
    with pytest.raises(type(error)):
        list(Servicer().Stream(None, context))
    assert context.calls == 0


def test_a_real_server_answers_a_base_exception_at_once_and_keeps_an_abort():
    class Servicer:
        @handle_errors
        def Call(self, request: bytes, context: grpc.ServicerContext) -> bytes:
            raise CheckpointLikeError("shard missing")

        @handle_errors
        def Refuse(self, request: bytes, context: grpc.ServicerContext) -> bytes:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "not yours")
            return b""

    servicer = Servicer()
    handler = grpc.method_handlers_generic_handler(
        "t.T",
        {
            "Call": grpc.unary_unary_rpc_method_handler(servicer.Call),
            "Refuse": grpc.unary_unary_rpc_method_handler(servicer.Refuse),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/t.T/Call")
            with pytest.raises(grpc.RpcError) as err:
                call(b"", timeout=10)
            with pytest.raises(grpc.RpcError) as refused:
                channel.unary_unary("/t.T/Refuse")(b"", timeout=10)
        assert err.value.code() == grpc.StatusCode.INTERNAL
        assert "CheckpointLikeError: shard missing" in err.value.details()
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert refused.value.details() == "not yours"
    finally:
        server.stop(0)
