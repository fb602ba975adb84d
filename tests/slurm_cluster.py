"""A real Slurm cluster inside a test: munged, slurmctld and three slurmds on one machine.

Each slurmd runs in its own network namespace with its own veth address and NodeName, so the
job steps it starts (and the services in them) live in that namespace and bind its address,
as on separate hosts. slurmctld and munged run in the host namespace; the bridge linking the
namespaces carries the controller's address. Everything (slurm.conf, spool, state, logs, the
munge key and socket) lives under the test's directory, on ports no default install uses.

Find or skip: needs root, ``ip netns`` and the Debian packages (slurmctld, slurmd,
slurm-client, munge 22.05); without them the fixture skips with the reason. With
``HYBRIDFLOW_TEST_INSTALL_SLURM=1`` it runs ``apt-get install`` itself first. Teardown
(daemons by process group, namespaces, links) runs even when the test fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests import skips

INSTALL_ENV = "HYBRIDFLOW_TEST_INSTALL_SLURM"
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "scontrol", "squeue", "scancel")
SUBNET = "10.78.0"
CONTROLLER_HOST = 1
"""The bridge's address in the host namespace: slurmctld listens there."""
CTLD_PORT = 16817
SLURMD_PORT = 16818
NUM_NODES = 3
NODE_INTERFACE = "hfnet0"
"""Each node's interface (in its namespace) carrying its NodeAddr."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def why_not_here() -> str:
    """Why a Slurm cluster cannot run here ("" when it can); installs the packages first
    when ``HYBRIDFLOW_TEST_INSTALL_SLURM=1``."""
    if os.geteuid() != 0:
        return skips.needs_root("network namespaces, slurmd")
    if shutil.which("ip") is None:
        return "needs the ip command (iproute2)"
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing and os.environ.get(INSTALL_ENV) == "1":
        subprocess.run(
            ["apt-get", "install", "-y", *PACKAGES], capture_output=True, timeout=900
        )  # the check below reports what is still missing
        missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        return (
            f"Slurm not installed ({', '.join(missing)} not found): apt-get install "
            f"{' '.join(PACKAGES)}, or set {INSTALL_ENV}=1"
        )
    probe = f"hfsprobe{os.getpid()}"
    out = _ip("netns", "add", probe, check=False)
    if out.returncode != 0:
        return f"cannot create a network namespace: {out.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return ""


class SlurmCluster:
    """munged + slurmctld (host namespace, on the bridge) + ``NUM_NODES`` slurmds, each in its
    own namespace. ``env`` is what a client command (sbatch, squeue, ...) needs; ``nodes``
    maps NodeName to its address."""

    def __init__(self, root: Path) -> None:
        self.root = root
        tag = str(os.getpid() % 100000)
        self.bridge = f"hfsbr{tag}"
        self.names = [f"node{i + 1}" for i in range(NUM_NODES)]
        self.ns = {n: f"hfs-{n}-{tag}" for n in self.names}
        self.dev = {n: f"hfs{i}{tag}" for i, n in enumerate(self.names)}
        self.nodes = {n: f"{SUBNET}.{11 + i}" for i, n in enumerate(self.names)}
        self.controller = f"{SUBNET}.{CONTROLLER_HOST}"
        self.conf = root / "etc" / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.logs = root / "log"
        self._daemons: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def __enter__(self) -> SlurmCluster:
        try:
            self._network()
            self._munge()
            self._write_conf()
            self._start("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
            for name in self.names:
                self._start(name, self._slurmd_command(name))
            self.wait_idle(60)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        """Daemons (each its own process group: slurmd's job steps go with it), then the
        namespaces, the links and the bridge. Never raises for what is already gone."""
        self._cancel_jobs()
        for proc in reversed(self._daemons.values()):
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self._daemons.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(10)
        for name in self.names:
            self._kill_namespace(name)
            _ip("netns", "del", self.ns[name], check=False)
            _ip("link", "del", self.dev[name] + "h", check=False)
        _ip("link", "del", self.bridge, check=False)

    def _cancel_jobs(self) -> None:
        if "slurmctld" in self._daemons and self._daemons["slurmctld"].poll() is None:
            subprocess.run(
                ["scancel", "--full", "--signal=KILL", "--user=root"],
                env=self.env, capture_output=True, timeout=30, check=False,
            )  # fmt: skip

    def _kill_namespace(self, name: str) -> None:
        """What is left in a node's namespace (a step slurmd did not reap): SIGKILL by pid."""
        out = subprocess.run(
            ["ip", "netns", "pids", self.ns[name]], capture_output=True, text=True, check=False
        )
        for pid in out.stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass

    def _network(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.controller}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for name in self.names:
            ns, dev, host_end = self.ns[name], self.dev[name], self.dev[name] + "h"
            _ip("netns", "add", ns)
            _ip("link", "add", host_end, "type", "veth", "peer", "name", dev)
            _ip("link", "set", dev, "netns", ns)
            # One name on every node, as a cluster's nodes share theirs (GLOO_SOCKET_IFNAME).
            _ip("-n", ns, "link", "set", dev, "name", NODE_INTERFACE)
            _ip("link", "set", host_end, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.nodes[name]}/24", "dev", NODE_INTERFACE)
            _ip("-n", ns, "link", "set", NODE_INTERFACE, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def _munge(self) -> None:
        """A fresh key and a private munged; slurm reaches it by ``AuthInfo=socket=``."""
        home = self.munge_socket.parent
        home.mkdir(parents=True, mode=0o700)
        key = home / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._start(
            "munged",
            ["munged", "-F", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
             f"--pid-file={home / 'munged.pid'}", f"--seed-file={home / 'munged.seed'}",
             f"--log-file={self.logs / 'munged.log'}"],
        )  # fmt: skip
        _wait_for(lambda: self.munge_socket.exists(), 30, "munged's socket", self._log_tail)

    def _write_conf(self) -> None:
        spool, state = self.root / "spool", self.root / "state"
        for d in (self.conf.parent, state, self.logs, *(spool / n for n in self.names)):
            d.mkdir(parents=True, exist_ok=True)
        nodes = "\n".join(
            f"NodeName={n} NodeAddr={a} Port={SLURMD_PORT} Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN"
            for n, a in self.nodes.items()
        )
        self.conf.write_text(
            f"""ClusterName=hftest
SlurmctldHost={socket.gethostname()}({self.controller})
SlurmctldPort={CTLD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={state}
SlurmdSpoolDir={spool}/%n
SlurmctldPidFile={self.root}/slurmctld.pid
SlurmdPidFile={self.root}/slurmd-%n.pid
SlurmctldLogFile={self.logs}/slurmctld.log
SlurmdLogFile={self.logs}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/linear
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmdTimeout=10
KillWait=30
MinJobAge=300
JobRequeue=1
SchedulerParameters=defer_batch=0
{nodes}
PartitionName=test Nodes={",".join(self.names)} Default=YES MaxTime=INFINITE State=UP
"""
        )

    def _start(self, name: str, argv: list[str]) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        out = (self.logs / f"{name}.stdout").open("ab")
        self._daemons[name] = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )

    def _log_tail(self) -> str:
        return "".join(
            f"\n--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
            for p in sorted(self.logs.glob("*"))
        )

    def wait_idle(self, timeout_s: float) -> None:
        """Until every node is idle (registered with slurmctld and free)."""
        _wait_for(
            lambda: set(self.node_states().values()) == {"idle"},
            timeout_s,
            "every node idle",
            lambda: f"{self.node_states()}{self._log_tail()}",
        )

    def node_states(self) -> dict[str, str]:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def run(
        self, argv: list[str], check: bool = True, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (sbatch, squeue, scontrol, ...) against this cluster."""
        return subprocess.run(
            argv, env={**self.env, **(env or {})}, capture_output=True, text=True,
            check=check, timeout=60,
        )  # fmt: skip

    def job_state(self, job_id: str) -> str:
        """PENDING, RUNNING, COMPLETED, CANCELLED, ... ("" when slurmctld no longer knows it)."""
        out = self.run(["scontrol", "-o", "show", "job", job_id], check=False).stdout
        for field in out.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return ""

    def wait_job(self, job_id: str, states: set[str], timeout_s: float) -> str:
        """Until the job is in one of ``states``; returns it."""
        _wait_for(
            lambda: self.job_state(job_id) in states,
            timeout_s,
            f"job {job_id} in {sorted(states)} (now {self.job_state(job_id)})",
            self._log_tail,
        )
        return self.job_state(job_id)

    def fail_node(self, name: str) -> None:
        """A node dies: SIGKILL to its slurmd and to every process in its namespace (the
        job's steps there, the batch step on the first node). slurmctld marks it DOWN once
        it misses ``SlurmdTimeout``."""
        _signal_group(self._daemons[name], signal.SIGKILL)
        self._kill_namespace(name)
        self._daemons[name].wait(10)

    def restart_node(self, name: str) -> None:
        """The node is back: a fresh slurmd registers it (``ReturnToService=2``)."""
        self._start(name, self._slurmd_command(name))

    def _slurmd_command(self, name: str) -> list[str]:
        # nsenter, not ``ip netns exec``: that remounts /sys, hiding the cgroup mounts
        # slurmd's cgroup plugin probes at start.
        argv = ["slurmd", "-D", "-N", name, "-f", str(self.conf)]
        return ["nsenter", f"--net=/run/netns/{self.ns[name]}", *argv]


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _wait_for(ready, timeout_s: float, what: str, detail=lambda: "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}{detail()}")
        time.sleep(0.2)


@pytest.fixture
def slurm_cluster(tmp_path: Path) -> Iterator[SlurmCluster]:
    """A running 3-node cluster under ``tmp_path/slurm``; skips (with the reason) where none
    can run."""
    reason = why_not_here()
    if reason:
        pytest.skip(reason)
    with SlurmCluster(tmp_path / "slurm") as cluster:
        yield cluster
