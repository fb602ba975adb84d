"""The learner worker: owns the actor (critic, reference), the optimizers and one train step.

``train_step`` on a batch of scored samples, the same on every rank of the SPMD group:
1. validate; split the batch into mini-batches, each mini-batch into contiguous rank slices;
2. per sample (no grad): old log-probs (only when several updates reuse the batch, else the
   detached current ones), reference log-probs (KL), critic values (PPO);
3. advantages: the configured estimator (``hybridflow.algorithms.registry``) over the whole
   batch on every rank, from the (overlong-shaped) score at the last response token minus the
   KL penalty in ``kl_mode="reward"``, with the gathered critic values for GAE;
4. per mini-batch: critic update (PPO), then actor update; micro-batches accumulate gradients,
   losses (the configured policy loss) are normalised by the global token/sequence counts and scaled by the world size
   (FSDP2 averages gradients over ranks), so the gradient equals the single-process one.
``policy_version`` rises by one per actor optimizer step.

With ``learner.topology.critic_nproc_per_node`` > 0 (``roles``) the critic lives on ranks of its own:
actor ranks run steps 2 and 4 for the actor (and hold the reference), critic ranks for the
critic, each sharded over its own group, so the two updates of a mini-batch run at the same
time; step 3 runs on every rank from values and KL penalties gathered over the whole world.

The preference presets (``algorithm`` dpo / rft) replace steps 2-4 with one online DPO or
RFT step (``online_preference``); their version rises by one per train step.

Knows nothing about gRPC, the coordinator or weight transports; single process and FSDP2 run
the same code (a single rank is a world of one).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hybridflow.algorithms.registry import (
    AdvantageEstimator,
    PolicyLossFn,
    resolve_advantage_estimator,
    resolve_policy_loss,
)
from hybridflow.arrays import FloatArray, TokenLike
from hybridflow.lora.export import merged_items, write_peft_dir
from hybridflow.lora.peft_layers import AdapterParams, AdaptersOff, inject
from hybridflow.models.router_replay import check_routing, moe_routers
from hybridflow.services.learner.batch_plans import (
    StepPlan,
    plan_step_micro_batches,
    split_contiguous,
)
from hybridflow.services.learner.batching import build_batch, validate_samples, validate_sequences
from hybridflow.services.learner.config import LearnerConfig
from hybridflow.services.learner.distributed import all_gather_objects, current_dist_info
from hybridflow.services.learner.forward import (
    output_head,
    policy_forward,
    prompt_sharing,
)
from hybridflow.services.learner.fsdp import iter_full_state_dict, shard_module
from hybridflow.services.learner.metrics import StepMetrics
from hybridflow.services.learner.mfu import (
    peak_tflops_for,
    policy_gradient_passes,
    step_flops,
    utilisation_metrics,
)
from hybridflow.services.learner.models import (
    decoder_layer_classes,
    load_actor,
    load_critic,
    load_reference,
    load_tokenizer,
    resolve_checkpoint,
)
from hybridflow.services.learner.online_preference import online_dpo_step, rft_step
from hybridflow.services.learner.optim_hparams import adamw_hparams, optimizer_lr
from hybridflow.services.learner.optim_layout import lay_out_adam_state
from hybridflow.services.learner.precision import (
    autocast_forward,
    check_memory_config,
    checkpoint_layers,
    fsdp_policies,
    reference_dtype,
)
from hybridflow.services.learner.preference import preference_step
from hybridflow.services.learner.preference_config import PreferenceConfig
from hybridflow.services.learner.roles import RankRole, rank_role
from hybridflow.services.learner.train_state import load_train_state
from hybridflow.services.learner.updates import UpdateContext, compute_advantages, precompute
from hybridflow.types import TrainSample, TrainStepResult

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_WHITENING_ESTIMATORS = ("gae", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
"""Estimators that whiten over the batch's tokens (they need at least two)."""


# ~500 lines in one class on purpose: it owns one rank's models, optimizers and policy
# version, and each method is an entry point the service relays (train step, log-probs,
# weights, train state). What a step computes lives in updates.py, the batch layout in
# batching.py and its split among ranks in batch_plans.py, the forwards in forward.py, the
# memory tools in precision.py and fsdp.py; the next split would move the weights' entry
# points (full_state_dict_items and its kin) out.
class LearnerWorker:
    """Actor (+ critic, reference) and their optimizers on this rank; see the module doc."""

    def __init__(self, config: LearnerConfig, model_path: str | Path) -> None:
        """``model_path``: builtin:tiny or a local checkpoint dir (the job's top-level model).

        One sequence on purpose: each load depends on the one before it (the device on the
        rank's role, the adapters on the seeded actor, the reference on the adapters, the
        sharding on every model, the optimizers on the sharded parameters)."""
        config.validate()
        self.config = config
        # User estimators / losses are imported here: a bad path fails at start-up.
        self.estimator: AdvantageEstimator | None = None
        self.policy_loss: PolicyLossFn | None = None
        if config.is_policy_gradient:
            self.estimator = resolve_advantage_estimator(config.resolved_advantage_estimator())
            self.policy_loss = resolve_policy_loss(config.policy_loss)
        torch.set_num_threads(config.topology.num_threads)
        self.dist = current_dist_info()
        needs_critic = self.estimator is not None and self.estimator.needs_critic
        if config.topology.critic_nproc_per_node > 0 and not needs_critic:
            raise ValueError(
                "learner.topology.critic_nproc_per_node > 0 needs an estimator with a critic (the ppo "
                f"preset / gae); {config.resolved_advantage_estimator()!r} has none"
            )
        self.role: RankRole = rank_role(config.topology.critic_nproc_per_node, self.dist)
        """What this rank holds and the group its models shard over (``roles``)."""
        if config.topology.device.startswith("cuda") and self.dist.is_distributed:
            self.device = torch.device("cuda", self.dist.local_rank)
        else:
            self.device = torch.device(config.topology.device)
        self.model_path = resolve_checkpoint(model_path)
        torch.manual_seed(config.seed)
        self.tokenizer = load_tokenizer(self.model_path)
        self._actor = load_actor(self.model_path, self.device) if self.role.holds_actor else None
        self.adapters: AdapterParams | None = None
        """The actor's LoRA adapters under their wire names (``learner.lora``), else None."""
        if config.lora.enabled and self._actor is not None:
            inject(self._actor, config.lora)  # seeded above: every rank draws the same A
            self.adapters = AdapterParams(self._actor)
        pad = self.tokenizer.pad_token_id
        # Right padding is masked out everywhere, so any in-vocab id may fill it.
        self.pad_id = int(pad) if pad is not None else 0
        memory = config.memory
        check_memory_config(memory, self.device.type, self.dist.is_distributed)
        self.reference: torch.nn.Module | None = (
            load_reference(
                self.model_path,
                self.device,
                reference_dtype(memory, self.dist.is_distributed),
            )
            if config.needs_reference and self.role.holds_actor and self.adapters is None
            else None
        )
        self.critic = (
            load_critic(self.model_path, self.device, config.seed)
            if needs_critic and self.role.holds_critic
            else None
        )
        if self._actor is not None:
            model: PreTrainedModel = self._actor
        else:
            assert self.critic is not None, "a rank holds the actor or the critic"
            model = self.critic.backbone
        self._refuse_unusable_actor(model_path)
        shares = memory.shared_prompts and not memory.packing and not config.moe_router_replay
        models = [m for m in (self._actor, self.critic) if m is not None]
        self.prompt_sharing = prompt_sharing(*models) if shares else None
        """``build_batch``'s ``sharing``: None where prompts are not shared (off, packing,
        router replay: a prompt's routing is each sample's own; or a model that cannot)."""
        embeddings = model.get_input_embeddings()
        assert isinstance(embeddings, torch.nn.Embedding), "input embeddings"
        self.vocab_size = int(embeddings.num_embeddings)
        self.num_params = sum(p.numel() for p in model.parameters())
        """The model's parameters (counted before sharding): N of the FLOPs estimate."""
        self.peak_tflops = config.peak_tflops
        """One device's peak TFLOP/s (``mfu.py``); None: unknown, no ``perf/mfu``."""
        if self.peak_tflops is None and self.device.type == "cuda":
            self.peak_tflops = peak_tflops_for(torch.cuda.get_device_name(self.device))
        self._apply_memory_config()
        if self.adapters is not None and config.needs_reference:
            # The reference is the base: the actor with its adapters off (no second copy).
            self.reference = AdaptersOff(self.actor)
        self._actor_optim = (
            None
            if self._actor is None
            else self._build_optimizer(
                [p for p in self._actor.parameters() if p.requires_grad], "actor"
            )
        )
        self.critic_optim = (
            None
            if self.critic is None
            else self._build_optimizer(self.critic.parameters(), "critic")
        )
        self.policy_version = 0
        """Actor optimizer steps taken so far (the version of the current weights)."""

    def _refuse_unusable_actor(self, model_path: str | Path) -> None:
        """ValueError for settings the loaded actor cannot honour: router replay without
        mixture-of-experts layers, chunked log-probs on logits post-processed after the head."""
        if self._actor is None:
            return
        if self.config.moe_router_replay and not moe_routers(self._actor):
            raise ValueError(
                f"learner.moe_router_replay: {model_path} has no mixture-of-experts layers "
                "whose routing could be replayed (Qwen3-MoE routers are)"
            )
        if self.config.memory.logprob_chunk_tokens > 0:
            output_head(self._actor)  # refuses a model whose logits it cannot chunk

    def _build_optimizer(
        self, params: Iterable[torch.nn.Parameter], role: str
    ) -> torch.optim.AdamW:
        """``role``'s ("actor" or "critic") AdamW over ``params``, its state laid out before
        any step allocates (``optim_layout.py``)."""
        optim = torch.optim.AdamW(params, **adamw_hparams(self.config, role))
        lay_out_adam_state(optim)
        return optim

    def _apply_memory_config(self) -> None:
        """``learner.memory``'s dtype, activation checkpointing and CPU offload on the
        models (``precision.py``), then FSDP2 sharding when distributed."""
        memory = self.config.memory
        if memory.activation_checkpointing:
            for module in (self._actor, self.critic):  # the trained ones
                if module is not None:
                    checkpoint_layers(module, decoder_layer_classes(module))
        models: list[torch.nn.Module] = [
            m for m in (self._actor, self.reference, self.critic) if m is not None
        ]
        if self.dist.is_distributed:
            for model in models:
                shard_module(
                    model,
                    decoder_layer_classes(model),
                    self.device.type,
                    self.role.group_size,
                    self.role.group,
                    fsdp_policies(memory, self.device.type),
                )
        elif memory.dtype == "bfloat16":
            for model in models:
                autocast_forward(model, self.device.type)

    @property
    def has_actor(self) -> bool:
        """This rank holds the actor (every rank unless it is a critic rank)."""
        return self._actor is not None

    @property
    def actor(self) -> PreTrainedModel:
        """The actor; RuntimeError on a critic rank (it holds none)."""
        if self._actor is None:
            raise RuntimeError(f"rank {self.dist.rank} is a critic rank: it holds no actor")
        return self._actor

    @property
    def actor_optim(self) -> torch.optim.Optimizer:
        """The actor's AdamW; RuntimeError on a critic rank."""
        if self._actor_optim is None:
            raise RuntimeError(f"rank {self.dist.rank} is a critic rank: it holds no actor")
        return self._actor_optim

    # ------------------------------------------------------------------ train
    def train_step(self, samples: list[TrainSample]) -> TrainStepResult:
        """One train batch: advantages, then ``ppo_epochs * num_mini_batches`` optimizer steps
        (dpo / rft: one online DPO / RFT step)."""
        cfg = self.config
        validate_samples(samples, self.vocab_size)
        if cfg.moe_router_replay and self._actor is not None:
            self._check_routing(samples)
        if not cfg.is_policy_gradient:
            return self._preference_train_step(samples)
        assert self.estimator is not None and self.policy_loss is not None
        if len(samples) < cfg.update.num_mini_batches:
            raise ValueError(
                f"samples: {len(samples)} samples cannot fill "
                f"learner.update.num_mini_batches={cfg.update.num_mini_batches}"
            )
        if (
            self.estimator.name in _WHITENING_ESTIMATORS
            and sum(len(s.response_ids) for s in samples) < 2
        ):
            raise ValueError(
                f"samples: advantage whitening ({self.estimator.name}) needs >= 2 response tokens"
            )
        plan = StepPlan.build(
            len(samples), cfg.update.num_mini_batches, self.role.group_size, self.role.group_rank
        )
        ctx = UpdateContext(
            config=cfg,
            samples=samples,
            plan=plan,
            device=self.device,
            pad_id=self.pad_id,
            world_size=self.role.group_size,
            metrics=StepMetrics(self.device),
            policy_loss=self.policy_loss,
            sharing=self.prompt_sharing,
        )
        for key, value in self._batch_metrics(samples).items():
            ctx.metrics.set_global(key, value)
        cache = precompute(ctx, self._actor, self.reference, self.critic)
        advantages, returns = compute_advantages(ctx, cache, self.estimator)
        num_updates = self.versions_per_step()
        for epoch in range(cfg.update.epochs):
            for mb in range(cfg.update.num_mini_batches):
                if self.critic is not None and self.critic_optim is not None:
                    ctx.critic_update(
                        self.critic, self.critic_optim, mb, cache, returns, 1.0 / num_updates
                    )
                if self._actor is not None and self._actor_optim is not None:
                    ctx.actor_update(
                        self._actor,
                        self._actor_optim,
                        mb,
                        cache,
                        advantages,
                        1.0 / num_updates,
                        first_epoch=epoch == 0,
                    )
                # Critic ranks count the actor's steps too: the version is the same everywhere.
                self.policy_version += 1
        metrics = ctx.metrics.reduce()
        metrics["actor/lr"] = self._lr_in_use()
        metrics["training/policy_version"] = float(self.policy_version)
        return TrainStepResult(policy_version=self.policy_version, metrics=metrics)

    def versions_per_step(self) -> int:
        """Policy versions one ``train_step`` adds: an optimizer step per epoch and mini-batch
        (the PPO family), one for dpo and rft. The schedule's staleness bound counts in it."""
        cfg = self.config
        if cfg.algorithm in ("dpo", "rft"):
            return 1
        return cfg.update.epochs * cfg.update.num_mini_batches

    def _check_routing(self, samples: list[TrainSample]) -> None:
        """ValueError naming the first sample without routing that fits the actor."""
        assert self._actor is not None
        for i, s in enumerate(samples):
            if s.routed_experts is None:
                raise ValueError(
                    f"samples[{i}].routed_experts: missing, and learner.moe_router_replay "
                    "replays them (the rollout reports them only with rollout.engine=vllm)"
                )
            tokens = len(s.prompt_ids) + len(s.response_ids)
            check_routing(self._actor, s.routed_experts, tokens, f"samples[{i}].routed_experts")

    def _preference_train_step(self, samples: list[TrainSample]) -> TrainStepResult:
        """algorithm dpo / rft: one step of ``online_preference``; the version rises by one."""
        cfg = self.config
        metrics = self._batch_metrics(samples)
        step = online_dpo_step if cfg.algorithm == "dpo" else rft_step
        metrics.update(step(self, samples))
        self.policy_version += 1  # a step on no pair or kept sample counts too
        metrics["actor/lr"] = self._lr_in_use()
        metrics["training/policy_version"] = float(self.policy_version)
        return TrainStepResult(policy_version=self.policy_version, metrics=metrics)

    def preference_step(self, records: Sequence[Any], cfg: PreferenceConfig) -> dict[str, float]:
        """One offline preference (or SFT) optimizer step on ``records`` (all ranks call:
        ``preference.preference_step``); its metrics. The version rises by one."""
        metrics = preference_step(self, records, cfg)
        self.policy_version += 1
        metrics["training/policy_version"] = float(self.policy_version)
        return metrics

    def load_train_state(self, directory: Path) -> int:
        """Restores what ``save_train_state`` saved in ``directory`` (every rank); the version."""
        self.policy_version = load_train_state(self, directory)
        return self.policy_version

    def _lr_in_use(self) -> float:
        """The actor optimizer's lr (a critic rank has none: the config's)."""
        return (
            self.config.optimizer.lr
            if self._actor_optim is None
            else optimizer_lr(self._actor_optim)
        )

    def _batch_metrics(self, samples: list[TrainSample]) -> dict[str, float]:
        """Statistics of the whole batch (every rank holds it: no reduction needed)."""
        out: dict[str, float] = {}
        for key, values in (
            ("critic/score", [s.reward for s in samples]),
            ("response_length", [float(len(s.response_ids)) for s in samples]),
            ("prompt_length", [float(len(s.prompt_ids)) for s in samples]),
            (
                "training/staleness",
                [float(self.policy_version - s.policy_version) for s in samples],
            ),
        ):
            out[f"{key}/mean"] = sum(values) / len(values)
            out[f"{key}/max"] = max(values)
            out[f"{key}/min"] = min(values)
        if self.config.moe_router_replay:  # tokens whose routing the learner replays
            out["training/router_replay_tokens"] = float(
                sum(len(s.routed_experts) for s in samples if s.routed_experts is not None)
            )
        return out

    def utilisation_metrics(self, samples: list[TrainSample], seconds: float) -> dict[str, float]:
        """``perf/tokens_per_s_per_device`` and ``perf/mfu`` of a train step on ``samples``
        that took ``seconds`` (``mfu.py``: the formula). The preference presets train on
        their chosen pairs or kept samples only: no FLOPs estimate, no ``perf/mfu``."""
        cfg = self.config
        num_tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
        flops = None
        if self.estimator is not None:
            passes = policy_gradient_passes(
                cfg.update.epochs,
                has_critic=self.estimator.needs_critic,
                # As ``precompute`` decides: old log-probs need a forward of their own.
                old_logprobs=cfg.update.epochs * cfg.update.num_mini_batches > 1
                or (cfg.needs_reference and cfg.kl.mode == "reward"),
                reference=cfg.needs_reference,
            )
            flops = step_flops(self.num_params, num_tokens, passes)
        return utilisation_metrics(
            num_tokens, seconds, self.dist.world_size, flops, self.peak_tflops
        )

    # ------------------------------------------------------------------ inference
    @torch.no_grad()
    def compute_logprobs(
        self, prompts: Sequence[TokenLike], responses: Sequence[TokenLike], temperature: float
    ) -> list[FloatArray]:
        """Per-token log-probs of each response under the current policy (all ranks call;
        critic ranks only join the gather, and come after the actor ranks in rank order)."""
        validate_sequences(prompts, responses, self.vocab_size)
        if temperature < 0 or not math.isfinite(temperature):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
        mine: list[FloatArray] = []
        if self._actor is None:
            return [row for part in all_gather_objects(mine) for row in part]
        memory = self.config.memory
        slices = [list(r) for r in split_contiguous(len(prompts), self.role.group_size)]
        lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
        for micro in plan_step_micro_batches(
            slices,
            self.role.group_rank,
            self.config.update.micro_batch_size,
            0,
            lengths,
            memory.max_tokens_per_micro_batch,
        ):
            batch = build_batch(
                [prompts[i] for i in micro.indices],
                [responses[i] for i in micro.indices],
                self.pad_id,
                self.device,
                micro.weights,
                packed=memory.packing,
                sharing=self.prompt_sharing,
            )
            logprobs, _ = policy_forward(self._actor, batch, temperature, False, memory.head_chunk)
            for row, (i, w) in enumerate(zip(micro.indices, micro.weights, strict=True)):
                if w > 0:
                    mine.append(logprobs[row, : len(responses[i])].float().cpu().numpy())
        return [row for part in all_gather_objects(mine) for row in part]

    # ------------------------------------------------------------------ weights
    def full_state_dict_items(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full actor tensors under HF names; every rank must exhaust it, rank 0 gets them
        (the gathers run over the actor ranks; a critic rank yields nothing). With LoRA:
        the base with the adapters merged in (``lora.export.merged_items``)."""
        if self._actor is None:
            return iter(())
        items = iter_full_state_dict(self._actor, emit=self.dist.rank == 0)
        if self.adapters is None:
            return items
        return merged_items(items, self.config.lora.scale)

    def adapter_items(self) -> list[tuple[str, torch.Tensor]]:
        """With LoRA, the adapters' full tensors under wire names (a collective over the
        actor ranks; rank 0 gets them): what a LoRA sync sends. ValueError without LoRA."""
        if self.adapters is None:
            raise ValueError("learner.lora is off: there are no adapters")
        return list(iter_full_state_dict(self.adapters, emit=self.dist.rank == 0))

    def save_checkpoint(self, path: str | Path) -> None:
        """HF checkpoint of the actor (save_pretrained + tokenizer) at ``path``; rank 0 writes.
        With LoRA it is the merged model, and ``path/adapter`` the PEFT adapter directory."""
        out = Path(path)
        state = (
            dict(self.full_state_dict_items())
            if self.dist.is_distributed or self.adapters is not None
            else None
        )
        adapters = self.adapter_items() if self.adapters is not None else []
        if self.dist.rank != 0:
            return
        out.mkdir(parents=True, exist_ok=True)
        self.actor.save_pretrained(out, state_dict=state)
        self.tokenizer.save_pretrained(out)
        if self.adapters is not None:
            write_peft_dir(out / "adapter", adapters, self.config.lora, str(self.model_path))
