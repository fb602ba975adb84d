"""Weight transports: how the learner's weights reach the rollout replicas.

``WeightPublisher`` (``base``) is the one interface; ``make_publisher`` (``publishers``)
chooses the implementation from ``weight_sync``: whole weights in-process or streamed over
gRPC (``SendPublisher``), or FSDP shards over a torch.distributed group along the resharding
plan (``dist_publisher.DistPublisher``; the group's forming is ``dist_formation``'s, the
replica side ``dist_receiver``'s). Replicas serve ``WeightSyncService`` (``servicer``); the
learner reaches them through ``client.GrpcWeightSyncClient``. Importing this package does
not import torch.
"""

from hybridflow.weights.base import (
    LocalWeightSender,
    SendPublisher,
    WeightPublisher,
    WeightSender,
    WeightSink,
)

__all__ = ["LocalWeightSender", "SendPublisher", "WeightPublisher", "WeightSender", "WeightSink"]
