"""The SDK's HTTP in front of ``TinkerService`` (FastAPI): routes, the API key, status codes.

Every route but ``client/config``, ``client/dynamic_config`` and ``healthz`` needs an
``X-API-Key`` the service knows; the key names the owner (``service.py``). Errors always carry
a JSON body (the SDK reads an empty 400 as a proxy's reject): 400 bad input, 401 bad key, 404
unknown to this owner (410 for a future: the SDK then sends a sample again), 413 body too large, 415 an encoding not decoded, 429 a bound reached
(the SDK backs off and retries). ``retrieve_future`` long-polls up to ``poll_seconds`` and then
answers ``try_again`` (under the SDK's 45 s read timeout).
"""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from hybridflow.errors import BadRequest, ResourceExhausted
from hybridflow.services.tinker.service import NotFound, TinkerService

PROTO = "application/x-protobuf"
MAX_BODY_BYTES = 64 << 20
"""The largest request body taken: the SDK chunks a forward_backward at 5 MB."""


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def build_app(service: TinkerService, keys: dict[str, str], poll_seconds: float = 15.0) -> FastAPI:
    """``keys``: API key -> owner name. ``poll_seconds``: how long a ``retrieve_future`` waits.

    One function on purpose: every route is a few lines that translate HTTP into one
    ``TinkerService`` call, and they share the key check and the body reader by closure; the
    routes read top to bottom as the SDK's API (docs/tinker-wire.md §2)."""
    if not keys or any(not k.startswith("tml-") for k in keys):
        raise ValueError("the Tinker service needs API keys, each starting with 'tml-'")
    app = FastAPI(title="hybridflow Tinker-compatible service", docs_url=None, redoc_url=None)

    def owner_of(request: Request) -> str:
        given = request.headers.get("x-api-key", "")
        for key, owner in keys.items():
            if hmac.compare_digest(given.encode(), key.encode()):
                return owner
        raise _Refused(401, "missing or unknown X-API-Key")

    async def json_body(request: Request) -> dict[str, Any]:
        raw = await _body(request)
        try:
            import json

            body = json.loads(raw or b"{}")
        except ValueError as exc:
            raise _Refused(400, f"the body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise _Refused(400, "the body must be a JSON object")
        return body

    @app.exception_handler(_Refused)
    async def _refused(_: Request, exc: _Refused) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse({"error": exc.args[0]}, status_code=404)

    @app.exception_handler(BadRequest)
    async def _bad(_: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=400)

    @app.exception_handler(ResourceExhausted)
    async def _full(_: Request, exc: ResourceExhausted) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=429, headers={"retry-after": "1"})

    @app.get("/api/v1/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config() -> dict[str, Any]:
        return service.client_config()

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config() -> dict[str, Any]:
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities(request: Request) -> dict[str, Any]:
        owner_of(request)
        return {"supported_models": [{"model_name": service.base.name, "trainable": True}]}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request) -> dict[str, Any]:
        owner = owner_of(request)
        await json_body(request)
        return {"type": "create_session", "session_id": service.create_session(owner)}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request) -> dict[str, Any]:
        owner = owner_of(request)
        body = await json_body(request)
        try:
            service.heartbeat(owner, str(body.get("session_id", "")))
        except NotFound as exc:
            raise _Refused(410, exc.args[0]) from None  # 410 stops the SDK's heartbeat
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str, request: Request) -> dict[str, Any]:
        service.finish_session(owner_of(request), session_id)
        return {}

    @app.post("/api/v1/telemetry")
    async def telemetry(request: Request) -> dict[str, str]:
        owner_of(request)
        return {"status": "accepted"}

    @app.post("/api/v1/create_model")
    async def create_model(request: Request) -> dict[str, Any]:
        owner = owner_of(request)
        body = await json_body(request)
        request_id = service.create_model(owner, body, _idempotency(request))
        return {"request_id": request_id}

    @app.post("/api/v1/get_info")
    async def get_info(request: Request) -> dict[str, Any]:
        owner = owner_of(request)
        body = await json_body(request)
        return service.get_info(owner, str(body.get("model_id", "")))

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> dict[str, Any]:
        owner = owner_of(request)
        if PROTO not in request.headers.get("content-type", ""):
            raise _Refused(415, f"forward_backward takes {PROTO}")
        if request.headers.get("content-encoding", "identity") != "identity":
            raise _Refused(415, "compressed bodies are not decoded (client config says so)")
        body = await _body(request)
        return {"request_id": service.forward_backward(owner, body, _idempotency(request))}

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request) -> dict[str, Any]:
        owner = owner_of(request)
        body = await json_body(request)
        return {"request_id": service.optim_step(owner, body, _idempotency(request))}

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request) -> dict[str, Any]:
        owner = owner_of(request)
        body = await json_body(request)
        return {
            "request_id": service.save_weights(owner, "save_weights", body, _idempotency(request))
        }

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_weights_for_sampler(request: Request) -> dict[str, Any]:
        owner = owner_of(request)
        body = await json_body(request)
        kind = "save_weights_for_sampler"
        return {"request_id": service.save_weights(owner, kind, body, _idempotency(request))}

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        owner = owner_of(request)
        body = await json_body(request)
        return {"request_id": service.load_weights(owner, body, _idempotency(request))}

    @app.get("/api/v1/training_runs/{model_id}")
    async def training_run(model_id: str, request: Request) -> dict[str, Any]:
        return service.training_run(owner_of(request), model_id)

    @app.get("/api/v1/training_runs/{model_id}/checkpoints")
    async def checkpoints(model_id: str, request: Request) -> dict[str, Any]:
        return service.checkpoints(owner_of(request), model_id)

    @app.delete("/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id:path}")
    async def delete_checkpoint(
        model_id: str, checkpoint_id: str, request: Request
    ) -> dict[str, Any]:
        service.delete_checkpoint(owner_of(request), model_id, checkpoint_id)
        return {}

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict[str, Any]:
        owner = owner_of(request)
        body = await json_body(request)
        sampler_id = service.create_sampling_session(owner, body)
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str, request: Request) -> dict[str, Any]:
        return service.get_sampler(owner_of(request), sampler_id)

    @app.post("/api/v1/asample")
    async def asample(request: Request) -> dict[str, Any]:
        owner = owner_of(request)
        body = await json_body(request)
        request_id, count = service.sample(owner, body)
        return {
            "request_id": request_id,
            "sample_sequence_ids": [f"{request_id}-{i}" for i in range(count)],
        }

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        import anyio.to_thread

        owner = owner_of(request)
        body = await json_body(request)
        request_id = str(body.get("request_id", ""))
        result = await anyio.to_thread.run_sync(service.retrieve, owner, request_id, poll_seconds)
        if result is None:
            return JSONResponse(
                {"type": "try_again", "request_id": request_id, "queue_state": "active"}
            )
        if result.error is not None:
            return JSONResponse({"error": result.error, "category": result.category})
        if result.proto is not None:
            return Response(result.proto, media_type=PROTO)
        return JSONResponse(result.json)

    return app


def _idempotency(request: Request) -> str | None:
    return request.headers.get("x-idempotency-key") or None


async def _body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _Refused(413, f"the body is {declared} bytes; the bound is {MAX_BODY_BYTES}")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _Refused(413, f"the body is over the bound of {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
