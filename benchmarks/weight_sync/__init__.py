"""Weight-sync benchmark: planner vs naive over gloo, gRPC streaming, raw broadcast ceiling."""
