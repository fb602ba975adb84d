"""A one-shot gRPC health check for container probes: exit 0 when the service answers SERVING.

Kubernetes' native ``grpc:`` probe speaks plaintext only (a ``mode: TLS`` field appears in the
v1.37 API), so a service that serves TLS is probed with this module as an ``exec`` probe:

    python -m hybridflow.deploy.health_probe --address localhost:50051 --tls-ca /etc/tls/ca.crt

It calls grpc.health.v1 Check (the overall status, service ""), which health and reflection
answer without the token. Knows nothing of the job config.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hybridflow-health-probe", description=__doc__)
    parser.add_argument("--address", required=True, help="host:port of the service")
    parser.add_argument("--tls-ca", default="", help="PEM CA bundle; enables TLS")
    parser.add_argument("--timeout-s", type=float, default=2.0, help="deadline of the check")
    args = parser.parse_args(argv)

    from hybridflow.rpc.channel import check_health
    from hybridflow.rpc.config import ChannelConfig

    config = ChannelConfig(tls_ca=args.tls_ca, retries=0)
    serving = check_health(args.address, timeout_s=args.timeout_s, config=config)
    print("SERVING" if serving else "NOT SERVING", file=sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
