"""Preflight: check a job's config and data before any service starts.

``problems(config_path, overrides)`` returns every problem found, one line each naming the
key, file or row: values out of range (every section, all at once), fixed ports already in
use, the model and the reward models of ``reward.components``, the environment classes of
``environment.envs``, TLS files, and the dataset (readable, non-empty, every row parsed, fields
present, ground truths where the row's scorer needs one, prompts within
``coordinator.max_prompt_bytes``). ``deploy/launch.sh`` and ``hybridflow-coordinator run``
call it right after loading the config; ``python -m hybridflow.deploy.preflight --config X``
prints the problems and exits 2, or prints "ok".

The dataset is read to check it once per launch: a clean check records what it read
(``dataset_stamp``), the launcher hands that to its coordinator, and the coordinator's own
preflight (``coordinator_problems``) checks the dataset again only when it is not the very
file the launcher checked, unchanged (always, then, when no launcher ran: Slurm, Kubernetes,
by hand).

It does not tokenise, load models or import torch/transformers/grpc (it must stay fast), and
it does not know how services use what it checks.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hybridflow.config.loader import ConfigError, apply_override, derive_keys, from_dict
from hybridflow.deploy.dataset_stamp import checked_by_launcher, record_validated, stamp
from hybridflow.job_config import JobConfig, load_job_config

EXIT_PROBLEMS = 2
"""Exit status when preflight finds a problem."""


def problems(config_path: str | Path | None, overrides: Sequence[str] = ()) -> list[str]:
    """Every problem of the job at ``config_path`` with ``overrides``; empty when all is well."""
    try:
        job = load_job_config(config_path, overrides)
    except ConfigError:
        return config_problems(config_path, overrides)
    return check_job(job)


def check_job(
    job: JobConfig, ports: Sequence[str] | None = None, dataset: bool = True
) -> list[str]:
    """Problems of a loaded (valid) job config: ports, model, TLS files, dataset.

    ports: the server keys whose fixed port must be free (None: every service's; the
    coordinator, started after the services, checks only its own).
    dataset: False leaves the dataset out (``coordinator_problems``: the launcher checked it).
    """
    return [
        *_port_problems(job, ports),
        *_model_problems(job.model),
        *_reward_model_problems(job),
        *_environment_problems(job),
        *_sandbox_problems(job),
        *_tls_problems(job),
        *_exposure_problems(job),
        *_tinker_problems(job),
        *(dataset_problems(job) if dataset else []),
        *eval_problems(job),
    ]


def coordinator_problems(job: JobConfig, environ: Mapping[str, str] | None = None) -> list[str]:
    """The coordinator's own preflight (the services already hold their ports): its port,
    the model, TLS files, and the dataset unless ``environ`` (default this process's) carries
    the launcher's stamp of this very file, unchanged (``dataset_stamp``)."""
    launcher_checked = checked_by_launcher(job, environ)
    return check_job(job, ports=["coordinator.server"], dataset=not launcher_checked)


def config_problems(config_path: str | Path | None, overrides: Sequence[str] = ()) -> list[str]:
    """Every config error, one line each: each section is checked even when another fails."""
    source = str(config_path) if config_path is not None else "<defaults>"
    try:
        raw: dict[str, Any] = {}
        if config_path is not None:
            path = Path(config_path)
            if not path.is_file():
                raise ConfigError(f"config file not found: {path}")
            loaded = yaml.safe_load(path.read_text()) or {}
            if not isinstance(loaded, dict):
                raise ConfigError(f"{source}: top level must be a mapping")
            raw = loaded
        for override in overrides:
            apply_override(raw, override, JobConfig)
    except (ConfigError, yaml.YAMLError, OSError) as exc:
        return [f"config error: {_strip_source(str(exc), source)}"]
    lines = _collect(JobConfig, raw, source, "")
    if not lines:  # the collector missed it: the loader's own message, never nothing
        try:
            load_job_config(config_path, overrides)
        except ConfigError as exc:
            lines = _strip_source(str(exc), source).splitlines()
    return [f"config error: {line}" for line in dict.fromkeys(lines)]


def _collect(cls: type, raw: Any, source: str, prefix: str) -> list[str]:
    """Problems of dataclass ``cls`` built from ``raw``: nested sections first, each on its
    own; then ``cls`` with broken sections left at their defaults (lines naming a broken
    section are dropped then, they would only echo the defaults)."""
    if not isinstance(raw, dict):
        return [f"{prefix.rstrip('.') or '<root>'}: must be a mapping"]
    found: list[str] = []
    clean = dict(raw)
    broken: list[str] = []
    try:  # each section sees the keys the job fills in from another (learner.temperature)
        derived = derive_keys(cls, raw, source, prefix)
    except ConfigError as exc:
        found.append(_qualify(_strip_source(str(exc), source), prefix))
        derived = raw
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        sub = hints.get(f.name)
        if f.name in raw and isinstance(sub, type) and dataclasses.is_dataclass(sub):
            sub_lines = _collect(sub, derived[f.name], source, f"{prefix}{f.name}.")
            if sub_lines:
                found += sub_lines
                broken.append(f"{prefix}{f.name}.")
                del clean[f.name]
    try:
        from_dict(cls, clean, source, prefix)
    except ConfigError as exc:
        for line in _strip_source(str(exc), source).splitlines():
            line = _qualify(line, prefix)
            if not any(b in line for b in broken):
                found.append(line)
    return found


def _strip_source(message: str, source: str) -> str:
    head = f"{source}: "
    return message[len(head) :] if message.startswith(head) else message


def _qualify(line: str, prefix: str) -> str:
    """'server.port: ...' raised by rollout.server becomes 'rollout.server.port: ...'."""
    if not prefix or line.startswith(prefix) or line.startswith("'"):
        return line
    parent, _, last = prefix.rstrip(".").rpartition(".")
    if line.startswith(last + ".") and parent:
        return f"{parent}.{line}"
    return line


def _servers(job: JobConfig) -> list[tuple[str, Any]]:
    environment = (
        [("environment.server", job.environment.server)] if job.environment.enabled else []
    )
    return [
        ("rollout.server", job.rollout.server),
        ("reward.server", job.reward.server),
        *environment,
        ("learner.server", job.learner.server),
        ("coordinator.server", job.coordinator.server),
    ]


def _port_problems(job: JobConfig, keys: Sequence[str] | None) -> list[str]:
    found: list[str] = []
    seen: dict[tuple[str, int], str] = {}
    for key, server in _servers(job):
        if server.port == 0 or (keys is not None and key not in keys):
            continue
        if key == "rollout.server" and job.rollout.replicas > 1:
            found.append(
                f"config error: {key}.port: fixed port {server.port} with rollout.replicas="
                f"{job.rollout.replicas} (replicas cannot share a port; use 0)"
            )
            continue
        where = (server.host, server.port)
        if where in seen:
            found.append(
                f"config error: {key}.port: {server.port} on {server.host} is also {seen[where]}"
            )
            continue
        seen[where] = f"{key}.port"
        reason = _bind_fails(server.host, server.port)
        if reason:
            found.append(
                f"config error: {key}.port: cannot listen on {server.host}:{server.port}: {reason}"
            )
    return found


def _bind_fails(host: str, port: int) -> str:
    """Why a listener on host:port cannot start ('' when it can); the socket is closed."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"unknown host ({exc.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no conflict
        try:
            sock.bind(address)
        except OSError as exc:
            return exc.strerror or str(exc)
    return ""


def _model_problems(model: str, key: str = "model", reward: bool = False) -> list[str]:
    """Problems of a checkpoint spec: a known builtin of its role, or a directory with
    config.json. ``reward``: the spec names a reward model (``builtin:tiny-rm``), else a policy."""
    from hybridflow.models import BUILTIN_PREFIX
    from hybridflow.models.builtin_policy import POLICY_SPECS
    from hybridflow.models.builtin_rm import REWARD_SPECS
    from hybridflow.models.hub import cached_snapshot, hub_offline, parse_hub_id
    from hybridflow.models.shapes import SHAPES

    known = sorted(REWARD_SPECS if reward else [*POLICY_SPECS, *SHAPES])
    if model.startswith(BUILTIN_PREFIX):
        name = model[len(BUILTIN_PREFIX) :]
        if name not in known:
            role = "reward model" if reward else "model"
            return [f"config error: {key}: unknown builtin {role} {name!r}; known: {known}"]
        return []
    hub_id = parse_hub_id(model)
    if hub_id is not None:
        # Online, the launcher downloads it; offline it must be in the cache already.
        if hub_offline() and cached_snapshot(hub_id) is None:
            return [
                f"config error: {key}: hub model {model!r} is not in the Hugging Face cache "
                "and HF_HUB_OFFLINE is set"
            ]
        return []
    path = Path(model).expanduser()
    if not path.is_dir():
        return [
            f"config error: {key}: {model!r} is not a directory (nor builtin:{known[0]}, "
            "nor a hub id org/name)"
        ]
    if not (path / "config.json").is_file():
        return [f"config error: {key}: {model!r} has no config.json"]
    return []


def _reward_model_problems(job: JobConfig) -> list[str]:
    found = []
    for i, component in enumerate(job.reward.components):
        if component.kind == "model":
            key = f"reward.components[{i}].model"
            found += _model_problems(component.model, key, reward=True)
    return found


def _tls_problems(job: JobConfig) -> list[str]:
    files: list[tuple[str, str]] = []
    for key, server in _servers(job):
        for name in ("tls_cert", "tls_key", "tls_client_ca"):
            files.append((f"{key}.{name}", getattr(server, name)))
    channel = job.coordinator.channel
    for name in ("tls_ca", "tls_cert", "tls_key"):
        files.append((f"coordinator.channel.{name}", getattr(channel, name)))
    found = []
    for key, value in files:
        if not value:
            continue
        path = Path(value).expanduser()
        if not path.is_file():
            found.append(f"config error: {key}: no such file {value!r}")
        elif not os.access(path, os.R_OK):
            found.append(f"config error: {key}: {value!r} is not readable")
    return found


def _environment_problems(job: JobConfig) -> list[str]:
    """Each ``environment.envs`` path names a class with reset and step (imported here, as
    the service would at an episode's reset): a typo is refused before anything starts."""
    from hybridflow.agents.runner import load_agent
    from hybridflow.envs.runner import load_environment_class

    found = []
    for i, path in enumerate(job.environment.envs):
        try:
            if path == job.coordinator.multi_turn.agent:
                load_agent(path)
            else:
                load_environment_class(path)
        except ValueError as exc:
            found.append(f"config error: environment.envs[{i}]: {exc}")
    return found


def _sandbox_problems(job: JobConfig) -> list[str]:
    """A job whose rewards or tools run the policy's code (``builtin:code``, the ``python``
    tool) needs its sandbox on this machine: refused here, naming what is missing, instead of
    failing at the first Score. (A file whose rows are ``code`` is caught by the reward
    service itself, which fails that Score naming why.)"""
    from hybridflow.data.code_task import DATA_SOURCE
    from hybridflow.envs.python_tool import ENV_PATH as PYTHON_TOOL

    specs = [job.coordinator.data, *(s.data for s in job.coordinator.eval.sets)]
    needs = []
    if not job.coordinator.multi_turn.enabled and any(
        s.startswith(f"builtin:{DATA_SOURCE}") for s in specs
    ):
        needs.append("reward.sandbox")
    if PYTHON_TOOL in job.environment.envs:
        needs.append("environment.sandbox")
    if not needs:
        return []
    from hybridflow.sandbox.bubblewrap import BubblewrapSandbox
    from hybridflow.sandbox.types import SandboxUnavailable

    try:
        BubblewrapSandbox()
    except SandboxUnavailable as exc:
        return [f"config error: {' and '.join(needs)}: {exc}"]
    return []


def _exposure_problems(job: JobConfig) -> list[str]:
    """A service off loopback needs TLS and a token. The launcher always provides a token
    (the per-run one when $HYBRIDFLOW_TOKEN is unset), so here it is TLS that is missing."""
    from hybridflow.rpc.config import remote_exposure_problem

    found = []
    for key, server in _servers(job):
        problem = remote_exposure_problem(server, token="launcher", key=key)
        if problem:
            found.append(f"config error: {problem}")
    return found


def _tinker_problems(job: JobConfig) -> list[str]:
    """The Tinker-compatible service's port, exposure and files (``tinker.enabled`` only)."""
    from hybridflow.rpc.config import is_loopback_host

    cfg = job.tinker
    if not cfg.enabled:
        return []
    found = []
    if cfg.port:
        reason = _bind_fails(cfg.host, cfg.port)
        if reason:
            found.append(
                f"config error: tinker.port: cannot listen on {cfg.host}:{cfg.port}: {reason}"
            )
    if not is_loopback_host(cfg.host) and not (cfg.tls_cert and cfg.tls_key):
        found.append(
            f"config error: tinker.host {cfg.host} is off loopback: set tinker.tls_cert and "
            "tinker.tls_key"
        )
    for key in ("keys_file", "tls_cert", "tls_key"):
        value = getattr(cfg, key)
        if value and not Path(value).expanduser().is_file():
            found.append(f"config error: tinker.{key}: no such file {value!r}")
    return found


def dataset_problems(job: JobConfig) -> list[str]:
    """Problems of the job's dataset (coordinator.data): unknown builtin, unreadable file, bad
    rows; empty when it is fine, and then its stamp (taken before the read) is recorded."""
    before = stamp(job)  # before reading: a change while it is read shows in the next stamp
    found = _dataset_problems(job)
    if not found and before is not None:
        record_validated(before)
    return found


def eval_problems(job: JobConfig) -> list[str]:
    """Problems of each held-out set of ``coordinator.eval`` (as of the job's dataset, named by
    its key); checked by every preflight (small files, and none is stamped)."""
    return [
        line
        for i, eval_set in enumerate(job.coordinator.eval.sets)
        for line in _dataset_problems(job, eval_set.data, f"coordinator.eval.sets[{i}].data")
    ]


def _dataset_problems(job: JobConfig, spec: str = "", key: str = "coordinator.data") -> list[str]:
    from hybridflow.data.datasets import check_prompt_rows, generated_problem, is_generated
    from hybridflow.services.reward.registry import ScorerRegistry

    spec = spec or job.coordinator.data
    if is_generated(spec):
        problem = generated_problem(spec)
        return [] if problem is None else [f"config error: {key}: {problem}"]
    try:
        registry = ScorerRegistry(job.reward)
    except ValueError as exc:  # a user scorer that does not import
        return [f"config error: {exc}"]

    def needs_ground_truth(data_source: str) -> bool | None:
        scorer = registry.resolve(data_source)
        return None if scorer is None else scorer.requires_ground_truth

    try:
        lines = check_prompt_rows(spec, job.coordinator.max_prompt_bytes, needs_ground_truth)
    except ImportError as exc:  # parquet without pyarrow
        lines = [f"{spec}: {exc}"]
    return [f"data error: {line}" for line in lines]


def report(found: Sequence[str]) -> int:
    """Prints each problem on stderr; the exit status (0 or EXIT_PROBLEMS)."""
    for line in found:
        print(line, file=sys.stderr)
    return EXIT_PROBLEMS if found else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hybridflow.deploy.preflight", description=__doc__
    )
    parser.add_argument("--config", default="deploy/configs/quickstart.yaml", help="job YAML")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    code = report(problems(args.config, args.set))
    if code == 0:
        print("ok")
    return code


if __name__ == "__main__":
    sys.exit(main())
