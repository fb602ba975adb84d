"""Weight transports from the learner to rollout replicas, behind one small interface.

The learner hands a transport ``(name, full tensor)`` pairs and a version; the transport
gets them into the replica's engine. Implementations: in-process (``LocalWeightSender``) and
gRPC streaming (``GrpcWeightSender``). A transport knows nothing of models or optimizers.
"""

from hybridflow.weights.base import LocalWeightSender, WeightSender, WeightSink

__all__ = ["LocalWeightSender", "WeightSender", "WeightSink"]
