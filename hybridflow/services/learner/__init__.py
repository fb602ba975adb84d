"""Learner service: actor/critic/reference under FSDP2, RL losses, optimizer, checkpoints.

``config`` imports without torch; ``worker.LearnerWorker`` is the pure (no gRPC) engine;
``distributed`` sets up the SPMD group and relays commands from rank 0 to the other ranks.
Importing this package imports nothing heavy.
"""
