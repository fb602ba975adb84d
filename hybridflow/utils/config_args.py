"""The command line every process shares for its config: ``--config FILE`` and repeatable
``--set KEY=VALUE`` (dotted overrides, applied by ``hybridflow.config.loader``)."""

from __future__ import annotations

import argparse

__all__ = ["add_config_args"]


def add_config_args(
    parser: argparse.ArgumentParser,
    config_help: str = "job YAML (e.g. deploy/configs/quickstart.yaml)",
    set_example: str = "rollout.server.port=50051",
) -> None:
    """Adds ``--config`` (``args.config``, None when absent) and ``--set`` (``args.set``, a
    list, empty when absent) to ``parser``."""
    parser.add_argument("--config", help=config_help)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"dotted override, e.g. --set {set_example} (repeatable)",
    )
