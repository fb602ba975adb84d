"""Measure router replay (R3) on the wired path: rollout-vs-learner log-prob mismatch on the
tiny Qwen3-MoE fixture, the same batch with and without replay.

    PYTHONPATH=$PWD python scripts/measure_router_replay.py [--rollout-dtype bfloat16]
        [--learner-dtype float32] [--prompts 16] [--n 4] [--new-tokens 12]

The vLLM engine samples with ``return_routed_experts`` (its workers record each request's
routing: ``services/rollout/vllm_routing.py``); the learner's forward (``policy_forward``
over a right-padded batch) runs once routing by itself and once replaying the rollout's
routing laid out by ``batch_routing``, as ``learner.moe_router_replay`` does. Prints the
share of token-layers routed differently and the max / mean |Δ log-prob| of each mode;
nothing is written.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollout-dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--learner-dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=12)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    from hybridflow.models.router_replay import batch_routing, moe_routers
    from hybridflow.services.learner.batching import build_padded_batch
    from hybridflow.services.learner.forward import policy_forward
    from hybridflow.services.rollout.vllm_engine import VLLMEngine
    from hybridflow.types import SamplingParams
    from tests.family_checkpoints import build_family_checkpoint

    torch.manual_seed(0)
    path = build_family_checkpoint(Path(tempfile.mkdtemp()) / "moe", "qwen3_moe", False)
    engine = VLLMEngine(path, dtype=args.rollout_dtype, max_model_len=64)
    prompts = [[5 + k, 30 + 2 * k, 60 + k, 17] for k in range(args.prompts)]
    params = SamplingParams(
        n=args.n, max_new_tokens=args.new_tokens, seed=0, return_routed_experts=True
    )
    groups = engine.generate(prompts, params)
    rows = [(p, c) for p, g in zip(prompts, groups) for c in g]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.learner_dtype))
    model.eval()
    cpu = torch.device("cpu")
    batch = build_padded_batch([p for p, _ in rows], [c.token_ids for _, c in rows], 0, cpu)
    routing = [c.routed_experts for _, c in rows]
    mask = batch.response_mask.bool()
    theirs = torch.zeros_like(batch.response_mask)
    for r, (_, c) in enumerate(rows):
        theirs[r, : len(c.logprobs)] = torch.from_numpy(c.logprobs)

    own: dict[int, torch.Tensor] = {}
    routers = moe_routers(model)
    hooks = [r.register_forward_hook(lambda m, a, o, i=i: own.__setitem__(i, o[2]))
             for i, r in routers.items()]  # fmt: skip
    with torch.no_grad():
        plain, _ = policy_forward(model, batch, 1.0, with_entropy=False)
    for h in hooks:
        h.remove()
    replay_rows = batch_routing(routing, batch.input_ids.shape[1], cpu)
    with torch.no_grad():
        batch.routed_experts = replay_rows
        replayed, _ = policy_forward(model, batch, 1.0, with_entropy=False)
    known = replay_rows[:, 0, 0] >= 0
    learner_choice = torch.stack([own[i] for i in routers], dim=1)[known].sort(-1).values
    rollout_choice = replay_rows[known].sort(-1).values
    differing = int((learner_choice != rollout_choice).any(-1).sum())
    print(f"rollout {args.rollout_dtype}, learner {args.learner_dtype}: {len(rows)} completions, "
          f"{int(mask.sum())} sampled tokens; {differing} of {learner_choice.shape[0] * len(routers)} "
          f"token-layers routed differently")  # fmt: skip
    for name, ours in (("no replay", plain), ("replay", replayed)):
        d = (ours - theirs).abs()[mask].numpy()
        print(f"  {name:9s}: max |Δ logprob| {d.max():.3e}, mean {d.mean():.3e}")
    engine.close()
    os._exit(0)  # vLLM's engine threads would otherwise hold the exit


if __name__ == "__main__":
    main()
