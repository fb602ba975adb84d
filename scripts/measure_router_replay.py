"""Measure router replay (R3): rollout-vs-learner log-prob mismatch on the tiny Qwen3-MoE
fixture, with and without replaying vLLM's routed experts in the transformers forward.

    PYTHONPATH=$PWD python scripts/measure_router_replay.py [--dtype bfloat16] [--prompts 16]

vLLM 0.32's own capture (``enable_return_routed_experts``) needs Model Runner V2, which needs
Triton, which vLLM's CPU build lacks; so on CPU this script captures the routing itself: a
forward hook on each MoE layer's router in vLLM's worker takes the top-k of its logits (the
choice vLLM's fused-MoE kernel makes from the same logits). Prompts go one at a time so the
hook's rows are that request's tokens. Prints one line per mode; nothing is written.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any


class RouterCapture:
    """vLLM worker extension: records the experts each MoE layer's router picks."""

    model_runner: Any

    def capture_routing(self) -> list[int]:
        import torch

        model = self.model_runner.get_model()
        top_k = int(model.config.num_experts_per_tok)
        self._routes: dict[int, list[Any]] = {}
        for i, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, "gate", None)
            if gate is None or not hasattr(layer.mlp, "experts"):
                continue
            self._routes[i] = []

            def hook(module: Any, args: Any, out: Any, i: int = i) -> None:
                logits = out[0] if isinstance(out, tuple) else out
                self._routes[i].append(torch.topk(logits.float(), top_k, dim=-1).indices)

            gate.register_forward_hook(hook)
        return sorted(self._routes)

    def take_routing(self) -> dict[int, list[list[int]]]:
        import torch

        out = {i: torch.cat(v).tolist() if v else [] for i, v in self._routes.items()}
        for v in self._routes.values():
            v.clear()
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=12)
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parent)
    sys.path.insert(0, here)
    os.environ["PYTHONPATH"] = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

    import numpy as np
    import torch

    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams

    from hybridflow.models.router_replay import moe_routers, replay_routing
    from tests.family_checkpoints import build_family_checkpoint

    path = build_family_checkpoint(Path(tempfile.mkdtemp()) / "moe", "qwen3_moe", False)
    llm = LLM(model=str(path), skip_tokenizer_init=True, dtype=args.dtype, enforce_eager=True,
              max_model_len=64, enable_prefix_caching=False, logprobs_mode="processed_logprobs",
              worker_extension_cls="measure_router_replay.RouterCapture", seed=0)  # fmt: skip
    llm.collective_rpc("capture_routing")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).eval()
    routers = moe_routers(model)
    diffs: dict[bool, list[np.ndarray]] = {False: [], True: []}
    num_differing = num_routed = 0
    for k in range(args.prompts):
        prompt = [5 + k, 30 + 2 * k, 60 + k, 17]
        llm.collective_rpc("take_routing")
        params = SamplingParams(temperature=1.0, max_tokens=args.new_tokens, logprobs=0, seed=k)
        (out,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        got = llm.collective_rpc("take_routing")[0]
        completion = out.outputs[0]
        ids = torch.tensor([prompt + list(completion.token_ids)])
        routed = torch.zeros(len(next(iter(got.values()))), len(got), 2, dtype=torch.long)
        for j, i in enumerate(sorted(got)):  # MoE layers in model order
            routed[:, j] = torch.tensor(got[i])
        theirs = np.array([next(iter(d.values())).logprob for d in completion.logprobs])
        own: dict[int, torch.Tensor] = {}
        hooks = [r.register_forward_hook(lambda m, a, o, i=i, own=own: own.__setitem__(i, o[2]))
                 for i, r in routers.items()]  # fmt: skip
        for replay in (False, True):
            with torch.no_grad(), replay_routing(model, routed if replay else None):
                logits = model(input_ids=ids).logits[0].float()
            if not replay:
                for h in hooks:
                    h.remove()
                for j, i in enumerate(sorted(own)):
                    idx = own[i]
                    mine, vllm = idx[: len(routed)].sort(-1).values, routed[:, j].sort(-1).values
                    num_differing += int((mine != vllm).any(-1).sum())
                    num_routed += len(routed)
            logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)
            ours = logprobs.gather(-1, ids[0, len(prompt) :, None])[:, 0].numpy()
            diffs[replay].append(np.abs(ours - theirs))
    print(f"{args.dtype}: vLLM and transformers route {num_differing} of {num_routed} "
          f"token-layers differently")  # fmt: skip
    for replay in (False, True):
        d = np.concatenate(diffs[replay])
        print(f"{args.dtype} replay={replay}: max |logprob diff| {d.max():.3e}, "
              f"mean {d.mean():.3e} over {d.size} tokens")  # fmt: skip
    os._exit(0)  # vLLM's engine threads would otherwise hold the exit


if __name__ == "__main__":
    main()
