"""Starts the Tinker-compatible service: loads the base model, builds the tenant engine and
serves the SDK's HTTP on a loopback port (TLS required off loopback).

``python -m hybridflow.services.tinker --model builtin:tiny-qwen3 --port 8000``; the API key is
``tml-<token>`` with the run's token (``$HYBRIDFLOW_TOKEN`` or ``--token-file``), plus one key
per line of ``--keys-file`` (``<owner> tml-<key>``: each owner its own tenants). It prints
``tinker service listening on http://HOST:PORT`` once it serves.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hybridflow.services.tinker.work import Tokens

log = logging.getLogger("hybridflow.tinker")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hybridflow.services.tinker", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", default="builtin:tiny-qwen3", help="the base model (spec)")
    parser.add_argument(
        "--served-name",
        default="",
        help="the name get_info reports and create_model asks for (default: --model)",
    )
    parser.add_argument(
        "--alias",
        action="append",
        default=[],
        help="another base_model name mapped to this model (a hub id), repeatable",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--token-file", default="", help="the run's token (else $HYBRIDFLOW_TOKEN)")
    parser.add_argument("--keys-file", default="", help="lines of '<owner> tml-<key>'")
    parser.add_argument(
        "--state-dir",
        default="tinker-state",
        help="where the journal, model states and checkpoints live ('' keeps nothing: a "
        "restart then loses every model)",
    )
    parser.add_argument("--max-tenants", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=65536, help="per forward_backward")
    parser.add_argument("--num-threads", type=int, default=1, help="torch threads")
    parser.add_argument("--poll-seconds", type=float, default=15.0)
    parser.add_argument(
        "--session-timeout",
        type=float,
        default=600.0,
        help="seconds without a call or heartbeat before a session is finished",
    )
    parser.add_argument(
        "--max-sample-batch",
        type=int,
        default=64,
        help="sample calls run as one batch at most (1: one at a time)",
    )
    parser.add_argument(
        "--journal-compact-mb",
        type=int,
        default=256,
        help="compact the journal when it grows this much (MiB) past what it last kept",
    )
    parser.add_argument(
        "--address-file", default="", help="where to write host:port once it listens"
    )
    parser.add_argument("--tls-cert", default="")
    parser.add_argument("--tls-key", default="")
    args = parser.parse_args(argv)
    for flag in ("max_tenants", "max_tokens", "num_threads", "max_sample_batch"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    for flag in ("poll_seconds", "session_timeout", "journal_compact_mb"):
        if getattr(args, flag) <= 0:
            parser.error(f"--{flag.replace('_', '-')} must be above 0")
    return args


def load_keys(args: argparse.Namespace) -> dict[str, str]:
    """API key -> owner: the run's token as ``tml-<token>`` (owner ``run``) and the keys file."""
    from hybridflow.rpc.token import resolve_token

    keys: dict[str, str] = {}
    token = resolve_token("HYBRIDFLOW_TOKEN", args.token_file)
    if token:
        keys[f"tml-{token}"] = "run"
    if args.keys_file:
        for number, line in enumerate(Path(args.keys_file).read_text().splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 2 or not parts[1].startswith("tml-"):
                raise SystemExit(f"{args.keys_file}:{number}: expected '<owner> tml-<key>'")
            keys[parts[1]] = parts[0]
    if not keys:
        raise SystemExit(
            "the Tinker service needs an API key: set HYBRIDFLOW_TOKEN, --token-file or "
            "--keys-file (clients then use TINKER_API_KEY=tml-<token>)"
        )
    return keys


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s tinker %(levelname)s %(message)s")
    from hybridflow.rpc.config import is_loopback_host

    if not is_loopback_host(args.host) and not (args.tls_cert and args.tls_key):
        raise SystemExit(f"--host {args.host} is off loopback: give --tls-cert and --tls-key")
    keys = load_keys(args)
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    service = build_service(args)
    import uvicorn

    from hybridflow.services.tinker.app import build_app

    app = build_app(service, keys, poll_seconds=args.poll_seconds)
    config = uvicorn.Config(
        app,
        log_level="warning",
        ssl_certfile=args.tls_cert or None,
        ssl_keyfile=args.tls_key or None,
        timeout_keep_alive=30,
    )
    server = uvicorn.Server(config)
    sock.listen(128)  # connections wait in the backlog from the moment the address is told
    host, port = sock.getsockname()[:2]
    scheme = "https" if args.tls_cert else "http"
    if args.address_file:
        tmp = Path(args.address_file + ".tmp")
        tmp.write_text(f"{host}:{port}\n")
        tmp.replace(args.address_file)
    print(f"tinker service listening on {scheme}://{host}:{port}", flush=True)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it stopped on: a clean stop
        log.info("stopped by SIGINT")
    finally:
        service.close()
    return 0


def build_service(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The base model (fp32, frozen), its tenant engine and the service around them."""
    import torch
    from transformers import AutoModelForCausalLM

    from hybridflow.models import resolve_model_path
    from hybridflow.services.learner.tenants import TenantTrainer
    from hybridflow.services.tinker.service import ServedBase, TinkerService
    from hybridflow.services.tinker.store import Store

    torch.set_num_threads(max(1, args.num_threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    path = resolve_model_path(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()  # no dropout: a forward's log-probs are the sampler's
    trainer = TenantTrainer(model, max_tenants=args.max_tenants, max_tokens=args.max_tokens)
    base = ServedBase(
        name=args.served_name or args.model, tokenizer_id=str(path), aliases=tuple(args.alias)
    )
    log.info("serving %s (%s) for up to %d tenants", base.name, path, args.max_tenants)
    store = Store(args.state_dir) if args.state_dir else None
    return TinkerService(
        trainer,
        base,
        store,
        tokens=_tokens(path, model),
        session_timeout_s=args.session_timeout,
        compact_journal_bytes=args.journal_compact_mb << 20,
        max_sample_batch=args.max_sample_batch,
    )


def _tokens(path: Path, model: Any) -> Tokens:
    """EOS ids (the generation config's, else the tokenizer's) and decoding, for sampling."""
    from transformers import AutoTokenizer

    from hybridflow.services.tinker.service import Tokens

    tokenizer = AutoTokenizer.from_pretrained(path)
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    ids = {eos} if isinstance(eos, int) else set(eos or ())
    return Tokens(ids, lambda tokens: str(tokenizer.decode(tokens, skip_special_tokens=False)))
