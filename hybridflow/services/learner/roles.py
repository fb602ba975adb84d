"""Which models a learner rank holds, and the process group that shards them.

With ``learner.topology.critic_nproc_per_node`` 0 every rank holds the actor, the reference and the
critic, sharded over the whole world (the default group). With N > 0 the world splits in two
(seed §1.3, HybridFlow's independent device groups): the first ranks are *actor ranks*
(actor, reference, actor optimizer) and the last N are *critic ranks* (critic and its
optimizer); each side shards over a process group of its own ranks, so the two updates run
at the same time. Every rank still receives every command and the whole batch; collectives
that both sides take part in (value / KL gathers, metric reduction, the relay) stay on the
default group. This module knows nothing about models, losses or the wire.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from hybridflow.services.learner.distributed import DistInfo


@dataclass(frozen=True)
class RankRole:
    """This rank's part in the learner: what it holds and the group its models shard over."""

    holds_actor: bool
    """Actor, reference and the actor optimizer live here."""
    holds_critic: bool
    """The critic (when the estimator needs one) and its optimizer live here."""
    group: dist.ProcessGroup | None
    """The group this rank's models shard over; None: the default group (whole world)."""
    group_rank: int
    """This rank's index in ``group``."""
    group_size: int
    """Ranks in ``group`` (the FSDP2 data-parallel degree of this rank's models)."""

    @property
    def is_split(self) -> bool:
        """Actor and critic live on different ranks."""
        return not (self.holds_actor and self.holds_critic)


def rank_role(critic_nproc_per_node: int, info: DistInfo) -> RankRole:
    """The role of rank ``info.rank``: critic ranks are the last ``critic_nproc_per_node``.

    A collective when splitting: every rank creates both groups (``dist.new_group`` must be
    called by the whole world, in the same order).
    """
    if critic_nproc_per_node == 0:
        return RankRole(True, True, None, info.rank, info.world_size)
    num_actor = info.world_size - critic_nproc_per_node
    if num_actor < 1:
        raise ValueError(
            f"learner.topology.critic_nproc_per_node={critic_nproc_per_node} leaves no actor rank in a "
            f"world of {info.world_size} (start nproc_per_node + critic_nproc_per_node ranks "
            "under torchrun)"
        )
    actor_group = dist.new_group(list(range(num_actor)))
    critic_group = dist.new_group(list(range(num_actor, info.world_size)))
    if info.rank < num_actor:
        return RankRole(True, False, actor_group, info.rank, num_actor)
    return RankRole(False, True, critic_group, info.rank - num_actor, critic_nproc_per_node)
