"""What a weight sync would cost at a scale this machine cannot host, read off the real plan.

``predict`` takes a ``TransferPlan`` (the one ``make_plan`` computes for the learner and the
replicas) and a ``LinkModel`` (how fast a GPU's links are, from public hardware specs) and
places the plan's ranks on nodes: the learner's ranks fill the first nodes
``gpus_per_node`` at a time, then each replica's TP ranks take the next free GPUs, a replica
starting a fresh node when it would not fit in what is left of the last one (so one no
larger than a node never spans two). Learner and rollout are on separate GPUs (the
disaggregated layout), sharing a node only where the learner leaves part of one free. Every bucket of the plan is one point-to-point send; a send between two GPUs
of one node crosses NVLink (``intra_bw``), anything else the sending GPU's and the receiving
GPU's network cards (``inter_bw`` each way, one card per GPU as in an HGX/DGX node).

The prediction is a bound of the plan's own traffic, not a packet simulation:

    seconds = max(over every GPU and direction: bytes over NVLink / intra_bw and
                                                bytes over its card / inter_bw;
                  over every node: the bytes its GPUs send each other / node_bw)
              + latency_s x the most buckets any one GPU sends or receives

(every GPU's links run at once, each at its rated speed, and a GPU's sends follow each
other). It leaves out what happens before and after the wire: the learner's cast into the
wire dtype (HBM-bound: milliseconds), the engine's reload of what it received (vLLM's
weight loaders: often the larger share of a published figure), and congestion in the
network's core (a full-bisection fabric is assumed). ``bottleneck`` names the link that sets
the first term. Pure numpy: no torch, no devices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybridflow.resharding.plan import TransferPlan


@dataclass(frozen=True)
class LinkModel:
    """The links of one kind of machine: bandwidths per GPU and direction, in bytes/s."""

    name: str
    gpus_per_node: int
    intra_bw: float
    """NVLink (or whatever joins the GPUs of a node), per GPU and direction."""
    inter_bw: float
    """The GPU's own network card, per direction."""
    latency_s: float
    """Fixed cost of one point-to-point send (launch, handshake), paid one after another."""
    source: str
    """Where the numbers come from."""
    node_bw: float = float("inf")
    """What all the sends inside one node share, in all (an NVSwitch's total; on a CPU
    machine its memory and cores, which every loopback byte passes through)."""


@dataclass(frozen=True)
class SyncPrediction:
    """``predict``'s answer for one plan on one link model."""

    seconds: float
    wire_seconds: float
    """The busiest link's bytes over its bandwidth."""
    latency_seconds: float
    bottleneck: str
    """The link that sets ``wire_seconds``, in words."""
    max_gpu_egress_bytes: int
    max_gpu_ingress_bytes: int
    inter_node_bytes: int
    """Bytes that cross the network in all."""
    intra_node_bytes: int
    max_buckets_per_gpu: int
    num_nodes: int


def node_of_ranks(plan: TransferPlan, gpus_per_node: int) -> np.ndarray:
    """Each weight-sync group rank's node: learner ranks first, then replica by replica on
    the next free GPUs, a replica starting a fresh node when it would not fit in what is left
    of the last one."""
    nodes = [r // gpus_per_node for r in range(plan.num_src_ranks)]
    next_node, used = divmod(plan.num_src_ranks, gpus_per_node)  # used: GPUs taken on next_node
    for tp in plan.replicas:
        if used and used + tp > gpus_per_node:
            next_node, used = next_node + 1, 0
        for k in range(tp):
            nodes.append(next_node + (used + k) // gpus_per_node)
        used += tp
        next_node, used = next_node + used // gpus_per_node, used % gpus_per_node
    return np.asarray(nodes, dtype=np.int64)


def predict(plan: TransferPlan, links: LinkModel) -> SyncPrediction:
    """The seconds one sync of ``plan`` takes on ``links`` (module doc), and why."""
    b = plan.bucket_columns
    nbytes = b["nbytes"].astype(np.int64)
    src = b["src_rank"].astype(np.int64)
    base = np.concatenate([[0], np.cumsum(plan.replicas)]).astype(np.int64)
    dst = plan.num_src_ranks + base[b["replica"]] + b["dst_rank"]
    nodes = node_of_ranks(plan, links.gpus_per_node)
    inter = nodes[src] != nodes[dst]
    size = plan.world_size

    def per_rank(ranks: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return np.bincount(ranks[mask], weights=nbytes[mask], minlength=size)

    loads = {
        "sends over NVLink": per_rank(src, ~inter) / links.intra_bw,
        "sends over its network card": per_rank(src, inter) / links.inter_bw,
        "receives over NVLink": per_rank(dst, ~inter) / links.intra_bw,
        "receives over its network card": per_rank(dst, inter) / links.inter_bw,
    }
    node_intra = np.bincount(nodes[src[~inter]], weights=nbytes[~inter], minlength=size)
    loads["shares its node's switch"] = (
        _on_first_rank_of_each_node(node_intra, nodes) / links.node_bw
    )
    what, times = max(loads.items(), key=lambda kv: float(kv[1].max()))
    busiest = int(np.argmax(times))
    role = plan.role(busiest)
    who = (
        f"node {int(nodes[busiest])}"
        if what.startswith("shares")
        else f"learner rank {role.src_rank}"
        if role.is_source
        else f"replica {role.replica} TP rank {role.tp_rank}"
    )
    if what.startswith("shares"):
        what = "(all its GPUs' NVLink traffic through the switch)"
    counts = np.bincount(src, minlength=size) + np.bincount(dst, minlength=size)
    wire = float(times.max())
    latency = float(counts.max()) * links.latency_s
    return SyncPrediction(
        seconds=wire + latency,
        wire_seconds=wire,
        latency_seconds=latency,
        bottleneck=f"{who} {what}",
        max_gpu_egress_bytes=int(np.bincount(src, weights=nbytes, minlength=size).max()),
        max_gpu_ingress_bytes=int(np.bincount(dst, weights=nbytes, minlength=size).max()),
        inter_node_bytes=int(nbytes[inter].sum()),
        intra_node_bytes=int(nbytes[~inter].sum()),
        max_buckets_per_gpu=int(counts.max()),
        num_nodes=int(nodes.max()) + 1,
    )


def _on_first_rank_of_each_node(per_node: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """``per_node[n]`` placed at node n's first rank (zeros elsewhere): a per-rank array."""
    out = np.zeros(len(nodes))
    firsts = np.unique(nodes, return_index=True)[1]
    out[firsts] = per_node[nodes[firsts]]
    return out
