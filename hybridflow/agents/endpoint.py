"""The OpenAI-compatible endpoint for agent episodes: an HTTP server whose every episode has
its own base URL and key, in front of a ``generate`` that reaches a rollout replica.

``open`` registers an episode (its id, the replica-bound ``generate``, the job's sampling,
its deadline) and returns ``(base_url, api_key)``: ``http://host:port/episodes/<id>/v1``
and a random key, so concurrent agents never mix and none can reach another's episode.
Under it: ``POST chat/completions`` and ``POST completions`` (``openai_wire``), ``GET
models``. Each chat request
goes through the episode's ``EpisodeCapture`` (the ids the engine generates from, then what
it generated), one request of an episode at a time. ``close`` ends the episode and returns
its trajectories; the episode's key stops working.

Bounds, each ending only its episode, with the reason kept for ``close``: the request body
(``max_body_bytes``), the request's values (``openai_wire.Bounds``), the episode's requests
and tokens (``CaptureLimits``), its wall time (a request after the deadline is refused),
live episodes (``max_episodes``). The training's sampling settings win over an agent's
(temperature, top_p: the log-probs the learner corrects against are the job's); an agent's
``max_tokens`` and ``stop`` apply within the job's ``max_new_tokens``. A ``stop`` string
cuts the completion after the token that completes it (the ids kept are a prefix of what was
sampled: still exactly on-policy).

Loopback by default. No grpc, no torch: ``generate`` and the tokenizer are given.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from hybridflow.agents import openai_wire as wire
from hybridflow.agents.capture import BreakRule, CaptureLimits, CaptureRefused, EpisodeCapture
from hybridflow.arrays import TokenArray
from hybridflow.envs.chat_tokens import ChatTokens
from hybridflow.types import Completion, SamplingParams

log = logging.getLogger(__name__)

Generate = Callable[[TokenArray, SamplingParams], Completion]
"""(context ids, sampling) -> one completion, on the episode's replica."""

_PATH = re.compile(r"^/episodes/([A-Za-z0-9_.:-]{1,128})/v1/(chat/completions|completions|models)$")


@dataclass(frozen=True)
class EndpointLimits:
    """The endpoint's bounds: live episodes, request bodies, an episode's wall time, its
    capture's and its requests' bounds, and the rule for a request that breaks its context."""

    max_episodes: int = 1024
    max_body_bytes: int = 4 * 1024 * 1024
    episode_wall_s: float = 600.0
    capture: CaptureLimits = CaptureLimits()
    wire: wire.Bounds = wire.Bounds()
    on_break: BreakRule = "split"


@dataclass
class EpisodeResult:
    """What ``close`` returns."""

    trajectories: list[Completion]
    num_requests: int
    breaks: dict[str, int]
    error: str | None
    """Why the episode was cut short (a bound, a refused request), None when it was not."""


@dataclass
class _Episode:
    key: str
    capture: EpisodeCapture
    generate: Generate
    params: SamplingParams
    deadline: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    error: str | None = None
    closed: bool = False


class AgentEndpoint:
    """The endpoint (module docstring). ``start`` serves on a thread; thread-safe."""

    def __init__(
        self,
        tokenizer: Any,
        model_name: str,
        limits: EndpointLimits = EndpointLimits(),
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat = ChatTokens(tokenizer)
        self.model_name = model_name
        self.limits = limits
        self.clock = clock
        self._episodes: dict[str, _Episode] = {}
        self._lock = threading.Lock()
        self._tools: dict[str, list[dict[str, Any]] | None] = {}
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        bound = self._server.server_address
        self.host, self.port = str(bound[0]), int(bound[1])
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="agent-endpoint", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ------------------------------------------------------------------ episodes
    def open(self, episode_id: str, generate: Generate, params: SamplingParams) -> tuple[str, str]:
        """Registers an episode; its (base_url, api_key). ValueError for a bad or live id or
        the bound on live episodes."""
        if not _PATH.match(f"/episodes/{episode_id}/v1/models"):
            raise ValueError(f"episode id {episode_id!r}: 1-128 of [A-Za-z0-9_.:-]")
        key = secrets.token_urlsafe(24)
        capture = EpisodeCapture(
            self.chat, self._render_for(episode_id), self.limits.capture, self.limits.on_break
        )
        episode = _Episode(
            key, capture, generate, params, self.clock() + self.limits.episode_wall_s
        )
        with self._lock:
            if episode_id in self._episodes:
                raise ValueError(f"episode {episode_id!r} is already open")
            if len(self._episodes) >= self.limits.max_episodes:
                raise ValueError(
                    f"{len(self._episodes)} episodes are open, the bound is max_episodes"
                )
            self._episodes[episode_id] = episode
        return f"{self.address}/episodes/{episode_id}/v1", key

    def close(self, episode_id: str) -> EpisodeResult:
        """Ends the episode (its key stops working) and returns what it captured; waits for
        a request of it still being served."""
        with self._lock:
            episode = self._episodes.pop(episode_id, None)
            self._tools.pop(episode_id, None)
        if episode is None:
            raise KeyError(f"episode {episode_id!r} is not open")
        with episode.lock:
            episode.closed = True
            capture = episode.capture
            return EpisodeResult(
                capture.trajectories(), capture.num_requests, dict(capture.breaks), episode.error
            )

    @property
    def num_open(self) -> int:
        with self._lock:
            return len(self._episodes)

    # ------------------------------------------------------------------ one request
    def serve_chat(self, episode_id: str, key: str, body: Any) -> tuple[int, dict[str, Any]]:
        """``/v1/chat/completions``: (HTTP status, the answer's JSON)."""
        return self._serve(episode_id, key, body, self._chat)

    def serve_completion(self, episode_id: str, key: str, body: Any) -> tuple[int, dict[str, Any]]:
        """``/v1/completions``: the prompt text extends the episode's text or starts a
        segment (``EpisodeCapture.context_for_text``)."""
        return self._serve(episode_id, key, body, self._completion)

    def _serve(
        self,
        episode_id: str,
        key: str,
        body: Any,
        handle: Callable[[str, _Episode, Any], tuple[int, dict[str, Any]]],
    ) -> tuple[int, dict[str, Any]]:
        """The key checked, one request of the episode at a time, a closed, failed or late
        episode refused, then ``handle``."""
        episode = self._authorized(episode_id, key)
        if episode is None:
            return HTTPStatus.UNAUTHORIZED, wire.error(
                "unknown episode or wrong key", "authentication_error"
            )
        if not episode.lock.acquire(blocking=False):
            return HTTPStatus.CONFLICT, wire.error(
                "this episode is serving another request: one at a time"
            )
        try:
            return self._refused(episode) or handle(episode_id, episode, body)
        finally:
            episode.lock.release()

    def _completion(
        self, episode_id: str, episode: _Episode, body: Any
    ) -> tuple[int, dict[str, Any]]:
        try:
            request = wire.parse_completion(body, self.limits.wire)
            context = episode.capture.context_for_text(request.prompt)
            completion, take, text, finish = self._generate(episode, context, request)
        except wire.BadRequest as exc:
            return HTTPStatus.BAD_REQUEST, wire.error(str(exc))  # the episode goes on
        except CaptureRefused as exc:
            return self._fail(episode, str(exc))
        episode.capture.add_generated(completion, text, take)
        answer = wire.text_completion(
            f"cmpl-{episode_id}-{episode.capture.num_requests}",
            self.model_name,
            text,
            finish,
            int(context.size),
            take,
        )
        return HTTPStatus.OK, answer

    def _refused(self, episode: _Episode) -> tuple[int, dict[str, Any]] | None:
        """The answer to any request of an episode that is closed, failed or past its
        deadline; None when it may go on."""
        if episode.closed:
            return HTTPStatus.GONE, wire.error("the episode is closed")
        if episode.error is not None:
            return HTTPStatus.BAD_REQUEST, wire.error(f"the episode ended: {episode.error}")
        if self.clock() > episode.deadline:
            wall = self.limits.episode_wall_s
            return self._fail(episode, f"the episode passed its wall time ({wall:g}s)")
        return None

    def _generate(
        self, episode: _Episode, context: TokenArray, request: Any
    ) -> tuple[Completion, int, str, str]:
        """(the completion, the ids kept, the text returned, its finish reason): the job's
        sampling with the request's token budget, stop strings and seed."""
        room = episode.capture.room()
        if room < 1:
            raise CaptureRefused("the episode has no room for more tokens")
        limit = min(episode.params.max_new_tokens, request.max_tokens or room, room)
        params = replace(episode.params, n=1, max_new_tokens=limit, seed=request.seed)
        completion = episode.generate(context, params)
        take, text = self._cut(completion, request.stop)
        stopped = completion.finish_reason == "stop" or take < completion.token_ids.size
        return completion, take, text, "stop" if stopped else "length"

    def _chat(self, episode_id: str, episode: _Episode, body: Any) -> tuple[int, dict[str, Any]]:
        try:
            request = wire.parse_chat(body, self.limits.wire)
            with self._lock:
                self._tools[episode_id] = request.tools
            context = episode.capture.context_for(request.messages)
            completion, take, text, finish = self._generate(episode, context, request)
        except wire.BadRequest as exc:
            return HTTPStatus.BAD_REQUEST, wire.error(str(exc))  # the episode goes on
        except CaptureRefused as exc:
            return self._fail(episode, str(exc))
        message, calls = wire.assistant_message(text)
        episode.capture.add_generated(completion, message, take)
        answer = wire.chat_completion(
            f"chatcmpl-{episode_id}-{episode.capture.num_requests}",
            self.model_name,
            message,
            "tool_calls" if calls else finish,
            int(context.size),
            take,
        )
        return HTTPStatus.OK, answer

    def _cut(self, completion: Completion, stops: tuple[str, ...]) -> tuple[int, str]:
        """(ids kept, the text returned): all but a final EOS, or up to the first stop
        string (the ids through the token that completes it)."""
        ids = completion.token_ids.tolist()
        text = str(self.tokenizer.decode(ids, skip_special_tokens=True))
        hits = [text.find(s) for s in stops if s in text]
        if not hits:
            return len(ids), text
        cut = min(hits)
        for k in range(1, len(ids) + 1):
            if len(str(self.tokenizer.decode(ids[:k], skip_special_tokens=True))) > cut:
                return k, text[:cut]
        return len(ids), text[:cut]

    def _fail(self, episode: _Episode, reason: str) -> tuple[int, dict[str, Any]]:
        episode.error = episode.error or reason
        return HTTPStatus.BAD_REQUEST, wire.error(f"the episode ended: {reason}")

    def _authorized(self, episode_id: str, key: str) -> _Episode | None:
        with self._lock:
            episode = self._episodes.get(episode_id)
        if episode is None or not hmac.compare_digest(episode.key.encode(), key.encode()):
            return None
        return episode

    def _render_for(self, episode_id: str) -> Callable[[Any, bool], str]:
        def render(messages: Any, generation_prompt: bool) -> str:
            with self._lock:
                tools = self._tools.get(episode_id)
            kwargs = {"tools": tools} if tools else {}
            # An assistant message that only calls tools has no content; templates read it.
            chat = [m if m.get("content") is not None else {**m, "content": ""} for m in messages]
            try:
                text = self.tokenizer.apply_chat_template(
                    chat, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
                )
            except Exception as exc:  # noqa: BLE001 — the template's own error (jinja's)
                raise CaptureRefused(
                    f"the chat template cannot render the messages: {exc}"
                ) from exc
            return str(text)

        return render


def _handler(endpoint: AgentEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 — the base's name
            log.debug("%s " + format, self.address_string(), *args)

        def do_GET(self) -> None:  # noqa: N802 — http.server's name
            match = _PATH.match(self.path)
            if match is None or match.group(2) != "models":
                self._send(HTTPStatus.NOT_FOUND, wire.error(f"no route {self.path}"))
                return
            if endpoint._authorized(match.group(1), self._key()) is None:  # noqa: SLF001
                self._send(
                    HTTPStatus.UNAUTHORIZED,
                    wire.error("unknown episode or wrong key", "authentication_error"),
                )
                return
            self._send(HTTPStatus.OK, wire.models(endpoint.model_name))

        def do_POST(self) -> None:  # noqa: N802
            match = _PATH.match(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            if match is None or match.group(2) == "models":
                self._drain(length)
                self._send(HTTPStatus.NOT_FOUND, wire.error(f"no route {self.path}"))
                return
            if length > endpoint.limits.max_body_bytes:
                self._send(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    wire.error(
                        f"body of {length} bytes, the bound is {endpoint.limits.max_body_bytes}"
                    ),
                    close=True,
                )
                return
            try:
                body = json.loads(self.rfile.read(length) or b"null")
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                self._send(HTTPStatus.BAD_REQUEST, wire.error(f"the body is not JSON: {exc}"))
                return
            try:
                serve = (
                    endpoint.serve_chat
                    if match.group(2) == "chat/completions"
                    else endpoint.serve_completion
                )
                status, answer = serve(match.group(1), self._key(), body)
            except Exception as exc:  # noqa: BLE001 — the replica failed: a 503 for the agent
                log.warning("episode %s: generation failed: %s", match.group(1), exc)
                status, answer = (
                    HTTPStatus.SERVICE_UNAVAILABLE,
                    wire.error(f"generation failed: {exc}", "server_error"),
                )
            self._send(status, answer)

        def _key(self) -> str:
            auth = self.headers.get("Authorization") or ""
            return auth[7:] if auth.startswith("Bearer ") else ""

        def _drain(self, length: int) -> None:
            if 0 < length <= endpoint.limits.max_body_bytes:
                self.rfile.read(length)

        def _send(self, status: int, body: dict[str, Any], close: bool = False) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

    return Handler
