"""The HF engine's ``generate`` at the 0.5B shape on issue 45's workload: 8 ``builtin:arith``
prompts (the chat template's 12 tokens) x 8 completions of 4 tokens. One warm-up and
``--calls`` timed calls in this process; prints one JSON line with the median. To compare two
trees, run it from each, alternating, on an otherwise idle machine:

    PYTHONPATH=<tree> python benchmarks/engines/group_generate.py [--threads 1] [--calls 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()

    from hybridflow.main.bootstrap import setup_torch_process

    setup_torch_process(args.threads)
    import numpy as np

    import hybridflow
    from hybridflow.data.arith import make_arith_rows
    from hybridflow.models import resolve_model_path
    from hybridflow.models.text_only import load_tokenizer
    from hybridflow.services.rollout.config import RolloutConfig
    from hybridflow.services.rollout.engines import build_engine
    from hybridflow.types import SamplingParams

    path = resolve_model_path("builtin:qwen2.5-0.5b-shape")
    tokenizer = load_tokenizer(path)
    prompts = []
    for row in make_arith_rows(8, seed=0):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": row["prompt"]}], add_generation_prompt=True, tokenize=False
        )
        prompts.append(np.asarray(tokenizer.encode(text, add_special_tokens=False)))
    config = RolloutConfig(engine="hf", seed=0, num_threads=args.threads)
    engine = build_engine(config, path)
    params = SamplingParams(temperature=1.0, max_new_tokens=4, n=8, seed=0)
    seconds = []
    for _ in range(1 + args.calls):
        start = time.perf_counter()
        engine.generate(prompts, params)
        seconds.append(time.perf_counter() - start)
    print(
        json.dumps(
            {
                "tree": hybridflow.__file__,
                "prompt_tokens": [int(p.size) for p in prompts],
                "warmup_s": seconds[0],
                "calls_s": seconds[1:],
                "median_s": statistics.median(seconds[1:]),
            }
        )
    )


if __name__ == "__main__":
    main()
