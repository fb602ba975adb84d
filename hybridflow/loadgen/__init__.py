"""``hybridflow-loadgen``: a load generator for a running rollout or reward service.

Pure parts (arrival schedule, statistics, report formatting, request shapes) live in their own
modules with no grpc; ``targets`` is the only module that speaks gRPC, ``runner`` drives any
target with asyncio, ``cli`` parses arguments before importing any of it.
"""
