"""Learner service configuration (imports without torch or grpc).

One dataclass: model, algorithm (GRPO, PPO, online DPO or RFT), optimizer, PPO clipping, KL,
critic, and the process settings. ``validate`` raises ``ValueError`` naming the field. This
module knows nothing about models, tensors or the wire.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from hybridflow.config.ranges import at_least, raise_problems
from hybridflow.rpc.config import ServerConfig
from hybridflow.services.learner.memory_config import LearnerMemoryConfig
from hybridflow.services.learner.preference_config import DPOLossType

LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
"""Loss aggregation modes (verl's names); mirrors ``hybridflow.algorithms.LOSS_AGG_MODES``."""

KL_ESTIMATOR_NAMES: tuple[str, ...] = ("k1", "kl", "k2", "mse", "k3", "low_var_kl", "abs")
"""KL estimator names; verl's aliases kl=k1, mse=k2, low_var_kl=k3 are accepted."""

ADVANTAGE_ESTIMATOR_NAMES: tuple[str, ...] = (
    "dr_grpo",
    "gae",
    "grpo",
    "grpo_batch_std",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "rloo",
)
"""Built-in estimators; mirrors ``hybridflow.algorithms.registry.BUILTIN_ADVANTAGE_ESTIMATORS``."""

POLICY_LOSS_NAMES: tuple[str, ...] = ("cispo", "gspo", "ppo_clip")
"""Built-in policy losses; mirrors ``hybridflow.algorithms.registry.BUILTIN_POLICY_LOSSES``."""

ALGORITHMS: tuple[str, ...] = ("grpo", "ppo", "dpo", "rft")
"""The ``algorithm`` presets: two policy-gradient ones, then the two preference ones."""

PRESET_ESTIMATORS: dict[str, str] = {"grpo": "grpo", "ppo": "gae"}
"""The estimator each policy-gradient preset picks when ``advantage_estimator`` is empty."""

POLICY_GRADIENT_ONLY: dict[str, object] = {
    "advantage_estimator": "",
    "policy_loss": "ppo_clip",
    "kl_coef": 0.0,
    "entropy_coef": 0.0,
    "ppo_epochs": 1,
    "num_mini_batches": 1,
    "off_policy": "none",
    "overlong_buffer": 0,
    "moe_router_replay": False,
}
"""Keys (with their defaults) that only the policy-gradient presets read: dpo and rft take
one DPO / SFT step per batch, so a non-default value would be silently ignored; refused."""


@dataclass
class LearnerConfig:
    """The learner: actor (plus critic and reference when needed), optimizer and RL loss."""

    algorithm: Literal["grpo", "ppo", "dpo", "rft"] = "grpo"
    """Preset: "grpo" (group-normalised outcome, PPO clip) or "ppo" (GAE with a critic, PPO
    clip), whose pieces advantage_estimator and policy_loss override; "dpo" (online DPO: each
    group's best vs worst response, against the frozen reference) or "rft" (rejection-sampling
    fine-tuning: SFT on the responses scoring >= rft_threshold), one step per batch."""
    dpo_beta: float = 0.1
    """Online DPO (algorithm dpo): strength of the implicit KL to the reference."""
    dpo_loss_type: DPOLossType = "sigmoid"
    """Online DPO: the loss on each pair's margin, as ``preference.dpo_loss_type``."""
    rft_threshold: float = 1.0
    """RFT (algorithm rft): responses with reward >= this are kept for the SFT step."""
    lr: float = 1e-5
    """Actor AdamW learning rate (constant)."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay (actor and critic)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas (actor and critic)."""
    grad_clip: float = 1.0
    """Max global gradient L2 norm (actor and critic); 0 disables clipping."""
    micro_batch_size: int = 8
    """Samples per forward/backward on one rank; gradients accumulate over micro-batches."""
    ppo_epochs: int = 1
    """Passes over each train batch."""
    num_mini_batches: int = 1
    """Optimizer steps per epoch: the batch is split into this many contiguous mini-batches."""
    clip_ratio_low: float = 0.2
    """PPO lower clip: the ratio is clipped at 1 - clip_ratio_low."""
    clip_ratio_high: float = 0.2
    """PPO upper clip: 1 + clip_ratio_high (raise it for clip-higher / DAPO, e.g. 0.28)."""
    clip_ratio_c: float | None = 3.0
    """Dual-clip bound for negative advantages (> 1); null disables dual-clip."""
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    """How token losses become one scalar."""
    norm_adv_by_std: bool = True
    """GRPO: divide by the group std (False: Dr. GRPO, mean-centred only)."""
    norm_adv_eps: float = 1e-6
    """Added to the std GRPO advantages are divided by (verl's 1e-6; TRL's is 1e-4)."""
    kl_coef: float = 0.0
    """Weight of the KL to the reference model (needs use_reference when > 0)."""
    kl_estimator: str = "k3"
    """KL estimator: k1, k2 (mse), k3 (low_var_kl) or abs."""
    off_policy: Literal["none", "tis", "decoupled"] = "none"
    """Correction for samples from older weights: none, tis (truncated importance sampling
    against the rollout log-probs) or decoupled (decoupled PPO, proximal log-probs recomputed)."""
    is_cap: float = 2.0
    """Truncation of the importance weights (tis); decoupled uses it times 5 as a safety cap."""
    moe_router_replay: bool = False
    """Mixture-of-experts models: the learner's forwards route each token to the experts the
    rollout engine routed it to (R3), so learner and rollout log-probs belong to the same
    computation; the coordinator asks the rollout to report them (needs rollout.engine
    vllm). The router still learns: its softmax weights over those experts are its own."""
    kl_mode: Literal["loss", "reward"] = "loss"
    """Where KL enters: "loss" (a loss term) or "reward" (a per-token reward penalty; PPO)."""
    use_reference: bool = False
    """Load a frozen copy of the initial actor as the KL reference (algorithm dpo always
    loads it; see ``needs_reference``)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (loss -= entropy_coef * entropy)."""
    temperature: float = 1.0
    """Log-prob temperature; must equal the rollout sampling temperature (0 counts as 1)."""
    critic_lr: float = 1e-5
    """Critic AdamW learning rate (PPO)."""
    gamma: float = 1.0
    """GAE discount (PPO)."""
    lam: float = 1.0
    """GAE lambda (PPO)."""
    value_clip: float | None = 0.5
    """Critic value clip range around the rollout-time values; null disables it (PPO)."""
    # Estimator / loss registry and DAPO's overlong shaping (issue 10), kept together.
    advantage_estimator: str = ""
    """Empty (the preset's), a built-in (gae, grpo, dr_grpo, rloo, reinforce_plus_plus,
    reinforce_plus_plus_baseline, remax) or "package.module:function" (imported at learner
    start). remax makes the coordinator generate one greedy response per prompt."""
    policy_loss: str = "ppo_clip"
    """A built-in (ppo_clip, gspo, cispo) or "package.module:function" (imported at start)."""
    overlong_buffer: int = 0
    """DAPO overlong shaping: responses longer than max_new_tokens - overlong_buffer get a
    linear penalty down to -overlong_penalty_factor at max_new_tokens; 0 disables it."""
    overlong_penalty_factor: float = 1.0
    """The overlong penalty at max_new_tokens (DAPO's penalty_factor)."""
    max_new_tokens: int = 0
    """Response length limit the overlong penalty counts from; must equal
    coordinator.sampling.max_new_tokens (checked by the job config) when overlong_buffer > 0."""

    seed: int = 0
    """Seed of torch's generator (critic head init)."""
    num_threads: int = 1
    """Torch intra-op threads of this process."""
    device: str = "cpu"
    """Torch device: "cpu", or "cuda" (each rank uses cuda:LOCAL_RANK)."""
    peak_tflops: float | None = None
    """Peak TFLOP/s of one learner device, the denominator of ``perf/mfu``; null: the
    table in ``mfu.py`` by CUDA device name (no default on CPU: MFU is then not reported)."""
    nproc_per_node: int = 1
    """Learner ranks torchrun starts (FSDP2 data-parallel shards); with critic_nproc_per_node
    > 0, the actor ranks (actor, reference, actor optimizer)."""
    devices: str = ""
    """CUDA_VISIBLE_DEVICES of the learner processes, e.g. "0,1" (empty: inherit); with
    critic_devices set, the actor ranks' devices, one per rank."""
    critic_nproc_per_node: int = 0
    """Critic ranks on their own process group (seed §1.3): torchrun then starts
    nproc_per_node + this many ranks, the last ones holding only the critic and its optimizer,
    so critic and actor updates run at the same time. 0: the critic lives on every learner
    rank. > 0 needs a critic (algorithm ppo / advantage_estimator gae)."""
    critic_devices: str = ""
    """The critic ranks' CUDA devices, e.g. "2,3", one per critic rank; the learner's
    processes then see devices + "," + critic_devices and each rank takes the device of its
    local rank (needs devices set). Empty: the critic ranks take the devices after the actor
    ranks' in whatever the learner sees."""
    nnodes: int = 1
    """Hosts the learner spans (torchrun's multi-node rendezvous): each host starts
    nproc_per_node (+ critic) ranks with its own node_rank; 1: a single host (--standalone)."""
    node_rank: int = 0
    """This host's index among the learner's nnodes (node 0 holds rank 0, which serves)."""
    rdzv_endpoint: str = ""
    """host:port of the rendezvous (node 0's address, reachable from every node) when
    nnodes > 1."""
    local_addr: str = ""
    """This node's address as the other nodes reach it (torchrun --local-addr; empty: its
    hostname). Set it where the hostname does not resolve to that address."""
    memory: LearnerMemoryConfig = field(default_factory=LearnerMemoryConfig)
    """Memory tools: precision, activation checkpointing, packing, token-budget
    micro-batches, chunked log-probs, CPU offload (``memory_config.py``)."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """Listening socket and transport limits (rank 0 serves)."""
    checkpoint_dir: str = ""
    """The only directory checkpoint RPCs write to or read from (deploy/launch.sh sets
    <run dir>/checkpoints); empty refuses them."""

    def validate(self) -> None:
        """Raise ValueError naming the bad fields (ranges: all at once; then the first)."""
        raise_problems(
            [
                *(
                    at_least(f"learner.{name}", getattr(self, name), 1)
                    for name in (
                        "micro_batch_size",
                        "ppo_epochs",
                        "num_mini_batches",
                        "num_threads",
                        "nproc_per_node",
                    )
                ),
                at_least("learner.seed", self.seed, 0),
                at_least("learner.critic_nproc_per_node", self.critic_nproc_per_node, 0),
            ]
        )
        if self.algorithm not in ALGORITHMS:
            raise ValueError(
                f"learner.algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}"
            )
        _positive("dpo_beta", self.dpo_beta)
        if not math.isfinite(self.rft_threshold):
            raise ValueError(f"learner.rft_threshold must be finite, got {self.rft_threshold}")
        _positive("lr", self.lr)
        _positive("critic_lr", self.critic_lr)
        _non_negative("weight_decay", self.weight_decay)
        _non_negative("grad_clip", self.grad_clip)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"learner.betas must be two numbers in [0, 1), got {self.betas!r}")
        for name in ("micro_batch_size", "ppo_epochs", "num_mini_batches", "num_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"learner.{name} must be >= 1, got {getattr(self, name)}")
        if self.nproc_per_node < 1:
            raise ValueError(f"learner.nproc_per_node must be >= 1, got {self.nproc_per_node}")
        if not 0.0 < self.clip_ratio_low < 1.0:
            raise ValueError(f"learner.clip_ratio_low must be in (0, 1), got {self.clip_ratio_low}")
        _positive("clip_ratio_high", self.clip_ratio_high)
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1.0:
            raise ValueError(f"learner.clip_ratio_c must be > 1 or null, got {self.clip_ratio_c}")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(
                f"learner.loss_agg_mode must be one of {LOSS_AGG_MODES}, got {self.loss_agg_mode!r}"
            )
        _non_negative("kl_coef", self.kl_coef)
        _positive("norm_adv_eps", self.norm_adv_eps)
        if self.kl_estimator not in KL_ESTIMATOR_NAMES:
            raise ValueError(
                f"learner.kl_estimator must be one of {KL_ESTIMATOR_NAMES}, "
                f"got {self.kl_estimator!r}"
            )
        if self.off_policy not in ("none", "tis", "decoupled"):
            raise ValueError(
                f"learner.off_policy must be none, tis or decoupled, got {self.off_policy!r}"
            )
        _positive("is_cap", self.is_cap)
        if self.kl_mode not in ("loss", "reward"):
            raise ValueError(f"learner.kl_mode must be 'loss' or 'reward', got {self.kl_mode!r}")
        if not self.is_policy_gradient:
            self._refuse_policy_gradient_keys()
        if self.kl_coef > 0 and not self.use_reference:
            raise ValueError("learner.kl_coef > 0 needs learner.use_reference: true")
        if self.is_policy_gradient:
            self._validate_estimator_and_loss()
        _non_negative("entropy_coef", self.entropy_coef)
        _non_negative("temperature", self.temperature)
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"learner.gamma must be in [0, 1], got {self.gamma}")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"learner.lam must be in [0, 1], got {self.lam}")
        if self.value_clip is not None:
            _positive("value_clip", self.value_clip)
        if self.peak_tflops is not None:
            _positive("peak_tflops", self.peak_tflops)
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"learner.device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        self._validate_critic_ranks()
        self._validate_nodes()

    @property
    def is_policy_gradient(self) -> bool:
        """grpo / ppo (advantages and a policy loss), not a preference preset (dpo / rft)."""
        return self.algorithm in PRESET_ESTIMATORS

    @property
    def needs_reference(self) -> bool:
        """Whether the learner loads the frozen reference: use_reference, or online DPO."""
        return self.use_reference or self.algorithm == "dpo"

    def resolved_advantage_estimator(self) -> str:
        """``advantage_estimator``, or the preset's when it is empty (policy-gradient presets)."""
        if not self.is_policy_gradient:
            raise ValueError(f"learner.algorithm {self.algorithm!r} has no advantage estimator")
        return self.advantage_estimator or PRESET_ESTIMATORS[self.algorithm]

    @property
    def num_ranks(self) -> int:
        """Learner processes torchrun starts: actor ranks plus critic ranks."""
        return self.nproc_per_node + self.critic_nproc_per_node

    @property
    def visible_devices(self) -> str:
        """CUDA_VISIBLE_DEVICES of the learner processes (actor devices, then critic ones)."""
        if self.critic_devices:
            return f"{self.devices},{self.critic_devices}"
        return self.devices

    def _validate_nodes(self) -> None:
        if self.nnodes < 1:
            raise ValueError(f"learner.nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(
                f"learner.node_rank must be in [0, {self.nnodes - 1}], got {self.node_rank}"
            )
        if self.nnodes > 1:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(
                    "learner.rdzv_endpoint: host:port of node 0's rendezvous is required when "
                    f"learner.nnodes > 1, got {self.rdzv_endpoint!r}"
                )

    def _validate_critic_ranks(self) -> None:
        if self.critic_nproc_per_node > 0:
            # A user estimator ("package.module:function") is checked when the learner loads it.
            estimator = self.resolved_advantage_estimator() if self.is_policy_gradient else ""
            builtin_without_critic = estimator in ADVANTAGE_ESTIMATOR_NAMES and estimator != "gae"
            if not estimator or builtin_without_critic:
                raise ValueError(
                    "learner.critic_nproc_per_node > 0 needs a critic (algorithm 'ppo' or "
                    f"advantage_estimator 'gae'), got algorithm {self.algorithm!r}"
                    + (f" with estimator {estimator!r}" if estimator else "")
                )
        if not self.critic_devices:
            return
        if self.critic_nproc_per_node == 0:
            raise ValueError("learner.critic_devices needs learner.critic_nproc_per_node > 0")
        for key, value, count in (
            ("devices", self.devices, self.nproc_per_node),
            ("critic_devices", self.critic_devices, self.critic_nproc_per_node),
        ):
            entries = [d for d in value.split(",") if d.strip()] if value else []
            if len(entries) != count:
                raise ValueError(
                    f"learner.{key} must list one device per rank ({count}) when "
                    f"learner.critic_devices is set, got {value!r}"
                )

    def _refuse_policy_gradient_keys(self) -> None:
        why = (
            "one DPO step per batch; its KL strength is learner.dpo_beta"
            if self.algorithm == "dpo"
            else "one SFT step per batch"
        )
        for key, default in POLICY_GRADIENT_ONLY.items():
            if getattr(self, key) != default:
                raise ValueError(
                    f"learner.{key} does not apply to learner.algorithm {self.algorithm!r} "
                    f"({why}): leave it at {default!r}, got {getattr(self, key)!r}"
                )

    def _validate_estimator_and_loss(self) -> None:
        for key, value, names in (
            ("advantage_estimator", self.resolved_advantage_estimator(), ADVANTAGE_ESTIMATOR_NAMES),
            ("policy_loss", self.policy_loss, POLICY_LOSS_NAMES),
        ):
            module, sep, attr = value.rpartition(":")
            if value not in names and not (sep and module and attr):
                raise ValueError(
                    f"learner.{key} must be one of {names} or 'package.module:function', "
                    f"got {value!r}"
                )
        if (
            self.kl_mode == "reward"
            and self.kl_coef > 0
            and self.resolved_advantage_estimator() in ("grpo", "grpo_batch_std", "dr_grpo")
        ):
            raise ValueError(
                "learner.kl_mode 'reward' does not apply to the grpo estimators "
                "(GRPO advantages come from sequence scores; use kl_mode 'loss')"
            )
        if self.overlong_buffer < 0:
            raise ValueError(f"learner.overlong_buffer must be >= 0, got {self.overlong_buffer}")
        if self.overlong_buffer > 0 and not self.overlong_buffer <= self.max_new_tokens:
            raise ValueError(
                f"learner.overlong_buffer ({self.overlong_buffer}) needs learner.max_new_tokens "
                f">= it (the sampling limit), got {self.max_new_tokens}"
            )
        _non_negative("overlong_penalty_factor", self.overlong_penalty_factor)


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"learner.{name} must be a finite number > 0, got {value}")


def _non_negative(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"learner.{name} must be a finite number >= 0, got {value}")
