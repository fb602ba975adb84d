"""The job's ``tinker:`` section: with ``enabled`` set, ``deploy/launch.sh`` runs the
Tinker-compatible service as the job's only process (no rollout, reward service or
coordinator: the user's own loop drives the training, docs/tinker.md). Imports without torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.fields import field_problems, knob
from hybridflow.config.ranges import raise_problems


@dataclass
class TinkerConfig:
    """The Tinker-compatible service of a job (the job's ``model`` is its base)."""

    enabled: bool = False
    """Run this job as the Tinker-compatible service (and nothing else)."""
    host: str = knob("127.0.0.1", free="a host name or address, checked when the server binds")
    """Where it listens; off loopback it needs tls_cert and tls_key."""
    port: int = knob(8000, ge=0, le=65535)
    """Its HTTP port; 0: the OS picks (the address goes to <run dir>/tinker.addr)."""
    state_dir: str = knob("", free="a directory, made when the service starts")
    """Its journal, model states and checkpoints; empty: <run dir>/tinker."""
    keys_file: str = knob("", free="a file path, read when the service starts")
    """Lines of '<owner> tml-<key>', one owner each; the run's token is always a key too
    (tml-<token>, owner 'run')."""
    served_name: str = knob("", free="a model name clients ask for")
    """The name get_info reports and create_model asks for; empty: the job's model."""
    aliases: list[str] = knob(default_factory=list, free="model names clients ask for")
    """Other names create_model may ask for the base by (a hub id the cookbook knows)."""
    max_tenants: int = knob(8, ge=1, le=1024)
    """LoRA models training at once on the base."""
    max_tokens: int = knob(65536, ge=1)
    """Tokens in one forward_backward."""
    num_threads: int = knob(1, ge=1, le=1024)
    """Torch threads of the service."""
    poll_seconds: float = knob(15.0, gt=0, lt=45)
    """How long a retrieve_future waits before it answers try_again (the SDK's own timeout
    is 45 s)."""
    session_timeout_s: float = knob(600.0, gt=0)
    """Seconds without a call or heartbeat before a session is finished and its models leave
    the base (their state and checkpoints stay; the SDK heartbeats every 10 s)."""
    max_sample_batch: int = knob(64, ge=1, le=1024)
    """Sample calls run as one batch at most (queued calls of every sampling session, each row
    with its session's adapter); 1: one call at a time."""
    journal_compact_mb: int = knob(256, ge=1, le=1 << 20)
    """The journal (<state dir>/journal.jsonl) is compacted when it grows this much past
    what it last kept: the bodies of calls a saved state holds and the calls no longer
    answered go."""
    tls_cert: str = knob("", free="a file path, read when the server starts")
    """PEM certificate; with tls_key, HTTPS."""
    tls_key: str = knob("", free="a file path, read when the server starts")
    """PEM private key of tls_cert."""

    def validate(self) -> None:
        raise_problems(
            [
                *field_problems(self, "tinker"),
                None
                if bool(self.tls_cert) == bool(self.tls_key)
                else "tinker.tls_cert and tinker.tls_key must be set together",
            ]
        )

    def server_args(self, model: str, run_dir: str) -> list[str]:
        """The service's command-line arguments (``python -m hybridflow.services.tinker``)."""
        args = ["--model", model, "--host", self.host, "--port", str(self.port)]
        args += ["--state-dir", self.state_dir or f"{run_dir}/tinker"]
        args += ["--max-tenants", str(self.max_tenants), "--max-tokens", str(self.max_tokens)]
        args += ["--num-threads", str(self.num_threads), "--poll-seconds", str(self.poll_seconds)]
        args += ["--session-timeout", str(self.session_timeout_s)]
        args += ["--journal-compact-mb", str(self.journal_compact_mb)]
        args += ["--max-sample-batch", str(self.max_sample_batch)]
        for flag, value in (
            ("--keys-file", self.keys_file),
            ("--served-name", self.served_name),
            ("--tls-cert", self.tls_cert),
            ("--tls-key", self.tls_key),
        ):
            if value:
                args += [flag, value]
        for alias in self.aliases:
            args += ["--alias", alias]
        return args
