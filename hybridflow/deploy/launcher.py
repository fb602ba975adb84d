"""Runs the services of a job's plan (``hybridflow.job.plan``: the reward, learner and
rollout services, and the environment service when ``environment.envs`` lists a class) as
separate processes on this machine, and stops them.

Each service runs in its own session (process group), so stopping ends the service and the
children it started (torchrun's ranks) and nothing else. Ports come from the OS: each service
writes its bound address to a port file that the launcher waits on, then checks health.
A rollout, reward or environment service can be started again on the address it had
(``restart``), so clients reconnect without learning a new one. Every process gets ``env`` (the launcher's
lifeline variables, the run token) on top of the launcher's environment.
Knows the job config's deploy fields, not the services' internals.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridflow.deploy.gpu_memory import GpuMemorySampler
from hybridflow.job.plan import JobPlan, Process, config_args, plan, python_command
from hybridflow.job_config import JobConfig
from hybridflow.utils.startup_marks import mark

log = logging.getLogger(__name__)


@dataclass
class ServiceProcess:
    """One service process the launcher started: its command (to restart it), log, port file
    and address."""

    name: str
    popen: subprocess.Popen[Any]
    port_file: Path
    log_path: Path
    address: str = ""
    cmd: list[str] = field(default_factory=list)
    """The command without config args and port file (what ``restart`` runs again)."""
    devices: str = ""
    started_at: float = field(default_factory=time.monotonic)
    """When it was spawned (its health deadline counts from here)."""
    spec: Process | None = None
    """Its entry in the job's plan (how it restarts)."""


@dataclass
class ServiceGroup:
    """The service processes of one job. Use as a context manager: exit stops them all."""

    job: JobConfig
    config_path: str | None
    overrides: list[str]
    run_dir: Path
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    """Added to every service's environment (lifeline pid, run token)."""
    processes: list[ServiceProcess] = field(default_factory=list)
    gpu_memory: GpuMemorySampler = field(default_factory=GpuMemorySampler)
    kill_now: bool = False
    """Set (from a signal handler) to cut the stop grace short: SIGKILL what is left."""
    job_plan: JobPlan | None = None
    """The processes to run; None: the job's own ``plan(job)`` (offline evaluation passes
    ``eval_plan(job)``)."""

    def __enter__(self) -> ServiceGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def plan(self) -> JobPlan:
        """The job's processes (the services this group runs are its ``services``)."""
        return self.job_plan if self.job_plan is not None else plan(self.job)

    def _spawn(
        self,
        name: str,
        cmd: list[str],
        devices: str = "",
        extra: Sequence[str] = (),
        spec: Process | None = None,
    ) -> ServiceProcess:
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        port_file = self.run_dir / f"{name}.addr"
        port_file.unlink(missing_ok=True)
        log_path = logs / f"{name}.log"
        env = {**os.environ, **self.env}
        if devices:
            env["CUDA_VISIBLE_DEVICES"] = devices
        env.setdefault("OMP_NUM_THREADS", "1")
        full = [*cmd, *config_args(self.config_path, self.overrides)]
        for override in extra:
            full += ["--set", override]
        full += ["--port-file", str(port_file)]
        with log_path.open("ab") as out:
            popen = subprocess.Popen(
                full, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        proc = ServiceProcess(name, popen, port_file, log_path, cmd=cmd, devices=devices, spec=spec)
        log.info("started %s (pid %d): %s", name, popen.pid, " ".join(full))
        return proc

    def live_processes(self) -> list[ServiceProcess]:
        """The current process of each service (after restarts, the newest)."""
        return list(self.processes)

    def restart(self, proc: ServiceProcess) -> ServiceProcess:
        """Starts ``proc``'s service again on the address it had; returns the new process
        (which replaces ``proc``). Only the plan's restartable services (rollout, reward,
        environment) can be restarted."""
        spec = proc.spec or self.plan.by_name(proc.name)
        pin = spec.restart_pin(proc.address)  # a replica adds its index to the base itself
        new = self._spawn(proc.name, proc.cmd, proc.devices, [pin], spec)
        new.address = proc.address
        self.processes[self.processes.index(proc)] = new
        return new

    def check_ready(self, proc: ServiceProcess) -> bool:
        """One non-blocking look: the port file is written and health answers SERVING."""
        from hybridflow.rpc.channel import check_health, make_channel

        if proc.popen.poll() is not None or not proc.port_file.exists():
            return False
        address = proc.port_file.read_text().strip()
        if address != proc.address:
            log.warning("%s came back on %s, not %s", proc.name, address, proc.address)
            proc.address = address
        channel = make_channel(address, self.job.coordinator.channel)  # TLS settings too
        try:
            return check_health(channel, timeout_s=1.0)
        finally:
            channel.close()

    def start(self) -> None:
        self.gpu_memory.start()  # samples peak GPU memory per process where nvidia-smi exists
        for spec in self.plan.services:
            command = python_command(self.python, spec, self.job.learner)
            self.processes.append(self._spawn(spec.name, command, spec.devices, spec=spec))

    def wait_ready(
        self, timeout_s: float, watch: Sequence[tuple[str, subprocess.Popen[Any]]] = ()
    ) -> dict[str, str]:
        """Waits for every service at once: its port file, then its health check. Each
        service has ``timeout_s`` from its own spawn. Raises at the first service that exits
        (RuntimeError, with its log's tail) or misses its deadline (TimeoutError), naming it;
        stopping the others is the caller's (``stop``). ``watch``: other processes started
        alongside (the coordinator) whose exit also ends the wait."""
        from hybridflow.rpc.channel import check_health, make_channel

        pending = list(self.processes)
        channels: dict[str, Any] = {}
        try:
            while pending:
                for name, popen in watch:
                    if popen.poll() is not None:
                        raise RuntimeError(
                            f"{name} exited with code {popen.returncode} before the services "
                            "were ready"
                        )
                for proc in list(pending):
                    if proc.popen.poll() is not None:
                        raise RuntimeError(
                            f"{proc.name} exited with code {proc.popen.returncode} before "
                            f"serving; see {proc.log_path}:\n{tail(proc.log_path)}"
                        )
                    if proc.name not in channels and proc.port_file.exists():
                        proc.address = proc.port_file.read_text().strip()
                        channels[proc.name] = make_channel(
                            proc.address,
                            self.job.coordinator.channel,  # TLS settings too
                        )
                    if proc.name in channels and check_health(channels[proc.name], timeout_s=1.0):
                        pending.remove(proc)
                        mark("launcher", f"{proc.name}_healthy")
                        log.info(
                            "%s serving on %s after %.1fs",
                            proc.name,
                            proc.address,
                            time.monotonic() - proc.started_at,
                        )
                    elif time.monotonic() - proc.started_at > timeout_s:
                        raise TimeoutError(
                            f"{proc.name} not serving after {timeout_s:.0f}s; see {proc.log_path}"
                        )
                if pending:
                    time.sleep(0.1)  # other processes' files and servers: nothing local to wait on
        finally:
            for channel in channels.values():
                channel.close()
        return {p.name: p.address for p in self.processes}

    def address_overrides(self) -> list[str]:
        """--set overrides that point the coordinator at the running services."""
        return self.plan.address_overrides({p.name: p.address for p in self.processes})

    def resource_usage(self) -> dict[str, dict[str, float]]:
        """Per live service, summed over its processes (torchrun ranks): peak RSS (VmHWM,
        bytes) and CPU seconds (user + system) so far."""
        out = {}
        for p in self.processes:
            if p.popen.poll() is None:
                pids = process_tree(p.popen.pid)
                out[p.name] = {
                    "peak_rss_bytes": float(sum(_peak_rss(pid) for pid in pids)),
                    "cpu_s": sum(_cpu_seconds(pid) for pid in pids),
                }
                if self.gpu_memory.available:
                    self.gpu_memory.sample()
                    peaks = self.gpu_memory.peak_bytes
                    out[p.name]["peak_gpu_bytes"] = float(sum(peaks.get(pid, 0) for pid in pids))
        return out

    def stop(self, grace_s: float = 15.0) -> None:
        self.gpu_memory.stop()
        self._terminate(grace_s)

    def _terminate(self, grace_s: float) -> None:
        """SIGTERM each service (torchrun forwards it to its ranks), then SIGKILL whatever is
        left in its process group after grace_s, or at once when ``kill_now`` is set."""
        for proc in self.processes:
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
                _signal_group(proc.popen, signal.SIGCONT)  # a stopped process must see it
        deadline = time.monotonic() + grace_s
        for proc in self.processes:
            while proc.popen.poll() is None:
                if time.monotonic() >= deadline or self.kill_now:
                    log.warning("%s did not stop in time; killing", proc.name)
                    break
                time.sleep(0.1)  # another process's exit: nothing local to wait on
            _signal_group(proc.popen, signal.SIGKILL)  # stragglers in the group (torchrun ranks)
            proc.popen.wait()
        self.processes.clear()


def _signal_group(popen: subprocess.Popen[Any], sig: int) -> None:
    try:
        os.killpg(popen.pid, sig)  # the service's own session: only what it started
    except ProcessLookupError:
        pass


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux /proc)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                children = (task / "children").read_text().split()
                todo.extend(int(c) for c in children)
        except OSError:
            continue
    return out


def _peak_rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def tail(path: Path, num_lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])
    except OSError:
        return ""
