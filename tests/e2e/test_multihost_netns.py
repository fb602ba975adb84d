"""Multi-host on one machine: every service in its own network namespace with its own
address, linked by veth pairs to a bridge; TLS and the token on; the learner's 2 ranks in two
namespaces through torchrun's rendezvous; the weight sync crosses namespaces over sockets.
The quickstart must learn (>= 0.9).

The namespaces share /dev/shm (one machine), so ``weight_sync.shared_memory: off`` makes the
weight sync take the socket path a real second host would. Needs root and ``ip``; skips
otherwise, with the reason. Everything it creates (namespaces, links, bridge) it removes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import skips

REPO = Path(__file__).resolve().parents[2]
SUBNET = "10.77.0"
ROLES = {"coord": 10, "roll": 11, "rew": 12, "l0": 13, "l1": 14}
PORTS = {"roll": 50711, "rew": 50712, "l0": 50713, "rdzv": 29511}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _can_make_namespaces() -> str:
    """Why the test cannot run here ("" when it can)."""
    if os.geteuid() != 0:
        return skips.needs_root("creating network namespaces")
    if shutil.which("ip") is None:
        return "needs the ip command (iproute2)"
    probe = f"hfprobe{os.getpid()}"
    out = _ip("netns", "add", probe, check=False)
    if out.returncode != 0:
        return f"cannot create a network namespace: {out.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return ""


class Network:
    """A bridge and one namespace per role, each with one veth and address 10.77.0.N/24."""

    def __init__(self) -> None:
        tag = str(os.getpid() % 100000)
        self.bridge = f"hfbr{tag}"
        self.ns = {role: f"hf-{role}-{tag}" for role in ROLES}
        self.dev = {role: f"hf{i}{tag}" for i, role in enumerate(ROLES)}
        self.addr = {role: f"{SUBNET}.{n}" for role, n in ROLES.items()}

    def __enter__(self) -> Network:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "up")
            for role in ROLES:
                ns, dev, host_end = self.ns[role], self.dev[role], self.dev[role] + "h"
                _ip("netns", "add", ns)
                _ip("link", "add", host_end, "type", "veth", "peer", "name", dev)
                _ip("link", "set", dev, "netns", ns)
                _ip("link", "set", host_end, "master", self.bridge, "up")
                _ip("-n", ns, "addr", "add", f"{self.addr[role]}/24", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for role in ROLES:
            _ip("netns", "del", self.ns[role], check=False)
            _ip("link", "del", self.dev[role] + "h", check=False)
        _ip("link", "del", self.bridge, check=False)

    def command(self, role: str, argv: list[str]) -> list[str]:
        """``argv`` inside ``role``'s namespace, gloo bound to its veth."""
        return [
            "ip", "netns", "exec", self.ns[role], "env",
            f"GLOO_SOCKET_IFNAME={self.dev[role]}", f"TP_SOCKET_IFNAME={self.dev[role]}",
            *argv,
        ]  # fmt: skip


def _certificate(tmp: Path) -> tuple[Path, Path]:
    """One self-signed certificate for every service address (the CA clients trust)."""
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    sans = ",".join(f"IP:{SUBNET}.{n}" for n in ROLES.values())
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=hybridflow-test", "-addext", f"subjectAltName={sans},IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@pytest.mark.slow
def test_quickstart_learns_across_namespaces(tmp_path: Path) -> None:
    reason = _can_make_namespaces()
    if reason:
        pytest.skip(reason)
    from hybridflow.job.plan import ranks_command
    from hybridflow.job_config import load_job_config

    cert, key = _certificate(tmp_path)
    py = sys.executable
    env = {**os.environ, "HYBRIDFLOW_TOKEN": "multi-host-test-token", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    with Network() as net:
        a = net.addr
        tls = [f"tls_cert={cert}", f"tls_key={key}"]
        overrides = [
            "coordinator.num_steps=150",
            "coordinator.save_checkpoint=false",
            "coordinator.progress=false",
            f"coordinator.channel.tls_ca={cert}",
            f"rollout.server.host={a['roll']}",
            f"rollout.server.port={PORTS['roll']}",
            f"reward.server.host={a['rew']}",
            f"reward.server.port={PORTS['rew']}",
            f"learner.server.host={a['l0']}",
            f"learner.server.port={PORTS['l0']}",
            *(f"{svc}.server.{t}" for svc in ("rollout", "reward", "learner") for t in tls),
            "learner.topology.nnodes=2",
            f"learner.topology.rdzv_endpoint={a['l0']}:{PORTS['rdzv']}",
            f"weight_sync.store_host={a['l0']}",
            # The learner sends only to these hosts; a replica joins only stores on these.
            f"weight_sync.allowed_hosts=[{a['roll']}, {a['l0']}]",
            "weight_sync.shared_memory=off",
            f"coordinator.rollout_addresses=[{a['roll']}:{PORTS['roll']}]",
            f"coordinator.reward_address={a['rew']}:{PORTS['rew']}",
            f"coordinator.learner_address={a['l0']}:{PORTS['l0']}",
        ]
        base = ["--config", str(REPO / "deploy/configs/quickstart.yaml")]
        base += [x for o in overrides for x in ("--set", o)]
        procs: list[subprocess.Popen[bytes]] = []
        logs = tmp_path / "logs"
        logs.mkdir()

        def start(role: str, argv: list[str]) -> None:
            out = (logs / f"{role}.log").open("wb")
            procs.append(
                subprocess.Popen(
                    net.command(role, argv), stdout=out, stderr=subprocess.STDOUT, env=env,
                    cwd=REPO, start_new_session=True,
                )
            )  # fmt: skip

        try:
            start("roll", [py, "-m", "hybridflow.main.rollout", *base])
            start("rew", [py, "-m", "hybridflow.main.reward", *base])
            for node, role in enumerate(("l0", "l1")):
                learner = load_job_config(
                    REPO / "deploy/configs/quickstart.yaml",
                    [
                        *overrides,
                        f"learner.topology.node_rank={node}",
                        f"learner.topology.local_addr={a[role]}",
                    ],
                ).learner
                cmd = ranks_command(py, "hybridflow.main.learner", learner)
                start(role, [*cmd, *base, "--set", f"learner.topology.node_rank={node}"])
            run_dir = tmp_path / "run"
            coordinator = subprocess.run(
                net.command("coord", [py, "-m", "hybridflow.main.coordinator", "run", *base,
                                      "--run-dir", str(run_dir)]),
                env=env, cwd=REPO, capture_output=True, text=True, timeout=900,
            )  # fmt: skip
            assert coordinator.returncode == 0, coordinator.stderr[-4000:] + _tails(logs)
            summary = json.loads((run_dir / "summary.json").read_text())
            assert summary["num_steps"] == 150
            assert summary["reward_end"] >= 0.9, summary
            assert (logs / "l1.log").read_text().count("Traceback") == 0, _tails(logs)
        finally:
            for p in procs:
                try:
                    os.killpg(p.pid, 15)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 30
            for p in procs:
                try:
                    p.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, 9)


def _tails(logs: Path) -> str:
    return "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(logs.glob("*.log")))
