"""gRPC plumbing shared by every service: server, channels, codec, auth, errors."""
