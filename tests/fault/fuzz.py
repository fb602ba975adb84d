"""A descriptor-driven fuzzer for our gRPC services (issue 8, "malformed input").

For every method of a service descriptor it builds random messages (edge-case numbers, NaN,
hostile strings, nested messages, inconsistent buffers) or raw garbage bytes, sends them
with a deadline through a generic channel (so undecodable bytes reach the server), and
tallies the status codes. A crash is an INTERNAL/UNKNOWN status raised by our code (an
unhandled exception); a hang is a DEADLINE_EXCEEDED. Nothing here knows what the services do.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
from google.protobuf import descriptor as d
from google.protobuf import message_factory
from google.protobuf.message import Message

_INTS = [0, 1, -1, 2, 7, 63, 64, 4096, 2**31 - 1, -(2**31), 2**16]
_INT64S = _INTS + [2**63 - 1, -(2**63), 2**40]
_FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-30, 1e308, float("nan"), float("inf"), -float("inf")]
_STRINGS = [
    "", "a", "..", "../../etc/passwd", "/tmp/x", "127.0.0.1:1", "localhost:0", "[::1]:5",
    "10.0.0.1:80", "\x00", "é" * 10, "x" * 1000, "float32", "int32", "bfloat16", "gloo",
    "arith", "model.embed_tokens.weight", '{"a": 1}', "[]", "null",
]  # fmt: skip
_DEADLINE_DETAIL = "Deadline Exceeded"
_GRPC_DESERIALIZE = "Exception deserializing request"


def _scalar(f: d.FieldDescriptor, rng: random.Random) -> object:
    t = f.type
    if t in (
        d.FieldDescriptor.TYPE_INT32,
        d.FieldDescriptor.TYPE_SINT32,
        d.FieldDescriptor.TYPE_SFIXED32,
    ):
        return rng.choice(_INTS) if rng.random() < 0.8 else rng.randint(-(2**31), 2**31 - 1)
    if t in (
        d.FieldDescriptor.TYPE_INT64,
        d.FieldDescriptor.TYPE_SINT64,
        d.FieldDescriptor.TYPE_SFIXED64,
    ):
        return rng.choice(_INT64S)
    if t in (d.FieldDescriptor.TYPE_UINT32, d.FieldDescriptor.TYPE_FIXED32):
        return abs(rng.choice(_INTS)) % 2**32
    if t in (d.FieldDescriptor.TYPE_UINT64, d.FieldDescriptor.TYPE_FIXED64):
        return abs(rng.choice(_INT64S)) % 2**64
    if t in (d.FieldDescriptor.TYPE_FLOAT, d.FieldDescriptor.TYPE_DOUBLE):
        value = rng.choice(_FLOATS) if rng.random() < 0.8 else rng.uniform(-10, 10)
        return (
            value
            if t == d.FieldDescriptor.TYPE_DOUBLE or abs(value) < 3e38 or value != value
            else 1.0
        )
    if t == d.FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if t == d.FieldDescriptor.TYPE_STRING:
        return rng.choice(_STRINGS)
    if t == d.FieldDescriptor.TYPE_BYTES:
        return rng.randbytes(rng.choice([0, 1, 3, 4, 8, 12, 64, 257]))
    if t == d.FieldDescriptor.TYPE_ENUM:
        return rng.choice(f.enum_type.values).number
    raise AssertionError(f"unhandled field type {t}")  # pragma: no cover


def random_message(desc: d.Descriptor, rng: random.Random, depth: int = 0) -> Message:
    """A random instance of ``desc``: each field set or not, edge values preferred."""
    msg = message_factory.GetMessageClass(desc)()
    for f in desc.fields:
        if rng.random() < 0.4:
            continue
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            continue  # no request of ours has a map field
        count = rng.choice([0, 1, 2, 3]) if f.is_repeated else 1
        for _ in range(count):
            if f.type == d.FieldDescriptor.TYPE_MESSAGE:
                if depth >= 3:
                    break
                if f.is_repeated:
                    getattr(msg, f.name).add().CopyFrom(
                        random_message(f.message_type, rng, depth + 1)
                    )
                else:
                    getattr(msg, f.name).CopyFrom(random_message(f.message_type, rng, depth + 1))
            elif f.is_repeated:
                getattr(msg, f.name).append(_scalar(f, rng))
            else:
                setattr(msg, f.name, _scalar(f, rng))
    return msg


def mutate(seed: Message, rng: random.Random) -> Message:
    """A copy of a valid ``seed`` with one field (possibly nested) replaced at random: reaches
    the code behind the first checks, which wholly random messages rarely pass."""
    msg = type(seed)()
    msg.CopyFrom(seed)
    target = msg
    for _ in range(3):
        f = rng.choice(target.DESCRIPTOR.fields)
        nested = f.type == d.FieldDescriptor.TYPE_MESSAGE and not f.is_repeated
        if nested and rng.random() < 0.6:
            target = getattr(target, f.name)
            continue
        target.ClearField(f.name)
        donor = random_message(target.DESCRIPTOR, rng)
        if f.is_repeated or f.type == d.FieldDescriptor.TYPE_MESSAGE:
            getattr(target, f.name).MergeFrom(getattr(donor, f.name))
        else:
            setattr(target, f.name, getattr(donor, f.name))
        break
    return msg


def random_payload(desc: d.Descriptor, rng: random.Random, seed: Message | None = None) -> bytes:
    """Serialized random message, a mutated ``seed`` (half the time, when given), or (one
    time in five) bytes that may not decode at all. A seed is sometimes sent unchanged, so
    the valid path runs between the bad ones."""
    if rng.random() < 0.2:
        return rng.randbytes(rng.randint(0, 64))
    if seed is not None and rng.random() < 0.5:
        return (mutate(seed, rng) if rng.random() < 0.75 else seed).SerializeToString()
    return random_message(desc, rng).SerializeToString()


@dataclass
class FuzzReport:
    """Status codes per method and the calls that crashed or hung."""

    codes: Counter[str] = field(default_factory=Counter)
    crashes: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    num_calls: int = 0


def _identity(b: bytes) -> bytes:
    return b


def fuzz_service(
    channel: grpc.Channel,
    service: d.ServiceDescriptor,
    num_messages: int,
    seed: int,
    timeout_s: float = 20.0,
    skip: frozenset[str] = frozenset(),
    seeds: dict[str, list[Message]] | None = None,
) -> FuzzReport:
    """Sends ``num_messages`` random requests, spread over the service's methods.
    ``seeds``: valid messages per method name to mutate (a client stream's in order)."""
    rng = random.Random(seed)
    report = FuzzReport()
    methods = [m for m in service.methods if m.name not in skip]
    for i in range(num_messages):
        method = methods[i % len(methods)]
        path = f"/{service.full_name}/{method.name}"
        valid = (seeds or {}).get(method.name)
        if valid and method.client_streaming and rng.random() < 0.5:
            # A valid stream, or one with a message mutated, dropped or repeated.
            payloads = [m.SerializeToString() for m in valid]
            i_bad = rng.randrange(len(payloads))
            action = rng.choice(["as_is", "mutate", "drop", "repeat"])
            if action == "mutate":
                payloads[i_bad] = mutate(valid[i_bad], rng).SerializeToString()
            elif action == "drop":  # (as_is: the valid stream itself)
                del payloads[i_bad]
            elif action == "repeat":
                payloads.insert(i_bad, payloads[i_bad])
        else:
            seed = rng.choice(valid) if valid else None
            payloads = [random_payload(method.input_type, rng, seed)]
            if method.client_streaming:
                extra = rng.randint(0, 3)
                payloads += [random_payload(method.input_type, rng) for _ in range(extra)]
        report.num_calls += 1
        try:
            _call(channel, method, path, payloads, timeout_s)
            code, details = "OK", ""
        except grpc.RpcError as exc:
            status = exc.code() if isinstance(exc, grpc.Call) else None
            code = status.name if status is not None else "UNKNOWN"
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        if code == "INTERNAL" and _GRPC_DESERIALIZE in (details or ""):
            code = "UNDECODABLE"  # grpc refused the bytes before our code saw them
        report.codes[f"{method.name}:{code}"] += 1
        where = f"{method.name}#{i}: {code} {details[:200]!r}"
        if code == "DEADLINE_EXCEEDED":
            report.hangs.append(where)
        elif code in ("INTERNAL", "UNKNOWN"):
            report.crashes.append(where)
    return report


def _call(
    channel: grpc.Channel,
    method: d.MethodDescriptor,
    path: str,
    payloads: list[bytes],
    timeout_s: float,
) -> None:
    kw = {"request_serializer": _identity, "response_deserializer": _identity}
    if method.client_streaming and method.server_streaming:
        list(channel.stream_stream(path, **kw)(iter(payloads), timeout=timeout_s))
    elif method.client_streaming:
        channel.stream_unary(path, **kw)(_iter(payloads), timeout=timeout_s)
    elif method.server_streaming:
        list(channel.unary_stream(path, **kw)(payloads[0], timeout=timeout_s))
    else:
        channel.unary_unary(path, **kw)(payloads[0], timeout=timeout_s)


def _iter(payloads: list[bytes]) -> Iterator[bytes]:
    yield from payloads
