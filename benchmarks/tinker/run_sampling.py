"""Sampling through the Tinker-compatible service, calls one at a time against calls batched
(``--max-sample-batch``), one tenant and two at once, in one run on one model
(``builtin:tiny-qwen3`` by default):

* each tenant (an owner of its own) makes a LoRA model, takes one step so its adapter is its
  own, and samples through a snapshot (``save_weights_and_get_sampling_client``);
* ``one tenant``: ``--calls`` sample calls (``num_samples`` 1, ``--prompt`` tokens in,
  ``--tokens`` out, the cookbook's shape: one call per environment) sent at once, timed until
  the last completes;
* ``two tenants``: both tenants' calls sent at once, each tenant's adapter on its rows.

The service runs as a real process on loopback, once per setting, the settings alternating
``--repeats`` times. Prints samples/s and writes ``results/tinker_sampling_*/summary.json``.
Run it on an otherwise idle machine:

    python benchmarks/tinker/run_sampling.py            # 64 calls of 16 + 16 tokens, 3 repeats
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

KEYS = {"a": "tml-bench-a", "b": "tml-bench-b"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=64, help="sample calls per tenant")
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", default="1,64", help="--max-sample-batch values to compare")
    parser.add_argument("--out", default="")
    return parser.parse_args(argv)


def _sampler(url: str, owner: str, seed: int) -> Any:
    import tinker
    from tinker import types

    from tests.tinker_service import BASE

    service = tinker.ServiceClient(base_url=url, api_key=KEYS[owner])
    client = service.create_lora_training_client(base_model=BASE, rank=8, seed=seed).result()
    tokens = list(range(5 + seed, 37 + seed))
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )
    client.forward_backward([datum], "cross_entropy").result()
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    return client.save_weights_and_get_sampling_client().result()


def _sample_all(sampler: Any, args: argparse.Namespace, seed: int) -> int:
    """``args.calls`` calls sent at once; the completions' token count."""
    from tinker import types

    prompt = types.ModelInput.from_ints([(seed * 7 + i) % 250 + 3 for i in range(args.prompt)])
    params = types.SamplingParams(max_tokens=args.tokens, stop=[])
    futures = [sampler.sample(prompt, 1, params) for _ in range(args.calls)]
    return sum(len(f.result().sequences[0].tokens) for f in futures)


def _timed(samplers: list[Any], args: argparse.Namespace) -> float:
    """Every sampler's calls at once, one thread each; completion tokens per second."""
    counts = [0] * len(samplers)

    def one(i: int) -> None:
        counts[i] = _sample_all(samplers[i], args, i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(samplers))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - start)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.tinker_service import running

    rows: dict[str, dict[str, list[float]]] = {}
    for repeat in range(args.repeats):
        for batch in args.batches.split(","):
            with tempfile.TemporaryDirectory() as folder:
                with running(Path(folder), KEYS, "--max-sample-batch", batch) as (url, _):
                    a, b = _sampler(url, "a", 1), _sampler(url, "b", 2)
                    _timed([a], args)  # warm-up
                    one = _timed([a], args)
                    two = _timed([a, b], args)
            row = rows.setdefault(batch, {"one tenant": [], "two tenants": []})
            row["one tenant"].append(one)
            row["two tenants"].append(two)
            print(f"repeat {repeat} batch {batch}: one {one:.0f} tok/s, two {two:.0f} tok/s")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = run(args)
    print(f"\n{args.calls} calls a tenant, {args.prompt} + {args.tokens} tokens, median of")
    print(f"{args.repeats}: completion tokens/s")
    print(f"{'max batch':>10} {'one tenant':>12} {'two tenants':>12}")
    for batch, row in rows.items():
        medians = [statistics.median(row[k]) for k in ("one tenant", "two tenants")]
        print(f"{batch:>10} {medians[0]:>12.0f} {medians[1]:>12.0f}")
    out = Path(args.out or REPO / "results" / time.strftime("tinker_sampling_%Y%m%d_%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    print(f"wrote {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
