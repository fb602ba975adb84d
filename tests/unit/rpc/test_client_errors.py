"""gRPC clients raise ``hybridflow.errors`` classes that are still ``grpc.RpcError``s."""

import grpc
import pytest

from hybridflow import errors
from hybridflow.rpc.client_errors import translate, translate_errors


class Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "why") -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, errors.BadRequest),
        (grpc.StatusCode.UNAVAILABLE, errors.Unavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, errors.Unavailable),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.ResourceExhausted),
        (grpc.StatusCode.FAILED_PRECONDITION, errors.FailedPrecondition),
        (grpc.StatusCode.ALREADY_EXISTS, errors.AlreadyExists),
        (grpc.StatusCode.INTERNAL, errors.ServiceError),
    ],
)
def test_each_status_becomes_its_domain_class(code, kind):
    exc = translate(Failed(code, "the details"), "127.0.0.1:5000")
    assert isinstance(exc, kind) and isinstance(exc, grpc.RpcError)
    assert exc.code() == code and exc.details() == "the details"
    assert str(exc) == f"127.0.0.1:5000: {code.name}: the details"
    assert type(exc).__name__ == kind.__name__


def test_bad_request_is_a_value_error_and_the_rest_service_errors():
    assert isinstance(translate(Failed(grpc.StatusCode.INVALID_ARGUMENT), "a"), ValueError)
    assert not isinstance(translate(Failed(grpc.StatusCode.INVALID_ARGUMENT), "a"), RuntimeError)
    assert isinstance(translate(Failed(grpc.StatusCode.UNAVAILABLE), "a"), errors.ServiceError)


def test_decorated_methods_translate_and_name_the_address():
    class Client:
        address = "10.0.0.1:7"

        @translate_errors
        def call(self):
            raise Failed(grpc.StatusCode.UNAVAILABLE, "connection refused")

        @translate_errors
        def read_stream(self):
            def replies():
                yield 1
                raise Failed(grpc.StatusCode.INVALID_ARGUMENT, "n too large")

            return list(replies())  # like generate: the stream is read inside the call

    with pytest.raises(
        errors.Unavailable, match=r"^10\.0\.0\.1:7: UNAVAILABLE in call: connection"
    ):
        Client().call()
    with pytest.raises(errors.BadRequest, match="INVALID_ARGUMENT in read_stream: n too large"):
        Client().read_stream()


def test_a_named_service_and_its_deadline_are_in_the_message():
    class Config:
        timeout_s = 120.0

    class Client:
        service = "learner"
        address = "10.0.0.1:7"
        _config = Config()

        @translate_errors
        def load_train_state(self):
            raise Failed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    with pytest.raises(errors.Unavailable) as err:
        Client().load_train_state()
    assert str(err.value) == (
        "learner at 10.0.0.1:7: DEADLINE_EXCEEDED after 120s in load_train_state: Deadline Exceeded"
    )


def test_data_loss_is_a_corrupt_checkpoint_and_a_failed_precondition():
    exc = translate(Failed(grpc.StatusCode.DATA_LOSS, "x.distcp: missing"), "a")
    assert isinstance(exc, errors.CheckpointCorrupt) and isinstance(exc, errors.FailedPrecondition)
