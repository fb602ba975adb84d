"""Learner service configuration (imports without torch or grpc). One file for the whole
section: its sub-sections are small, each field with its docstring and bound, and a reader
(and the loader) sees the tree of ``learner.*`` keys in one place.

``LearnerConfig`` picks the algorithm (GRPO, PPO, online DPO or RFT) and the pieces that
override its preset (advantage estimator, policy loss); its sections hold the rest by concern:
``optimizer``, ``update`` (micro-batches, epochs, mini-batches), ``loss`` (PPO clipping,
aggregation, entropy, off-policy correction), ``advantage``, ``kl``, ``critic``, ``overlong``,
``dpo`` / ``rft`` and ``topology`` (devices, ranks, nodes). Bounds sit on the fields (``knob``);
``validate`` raises ``ValueError`` naming the field. The old flat keys (``learner.lr``) still
load, moved to their new place (``RENAMED_KEYS``). ``temperature`` and ``max_new_tokens`` are
taken from ``coordinator.sampling``. This module knows nothing about models, tensors or the wire.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from hybridflow.config.fields import derived, field_problems, knob
from hybridflow.config.ranges import raise_problems
from hybridflow.lora.config import LoraConfig
from hybridflow.rpc.config import ServerConfig
from hybridflow.services.learner.memory_config import LearnerMemoryConfig
from hybridflow.services.learner.preference_config import DPOLossType

LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)
"""Loss aggregation modes (verl's names); mirrors ``hybridflow.algorithms.LOSS_AGG_MODES``."""

KLEstimator = Literal["k1", "kl", "k2", "mse", "k3", "low_var_kl", "abs"]
KL_ESTIMATOR_NAMES: tuple[str, ...] = get_args(KLEstimator)
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
    "kl.coef": 0.0,
    "loss.entropy_coef": 0.0,
    "update.epochs": 1,
    "update.num_mini_batches": 1,
    "loss.off_policy": "none",
    "overlong.buffer": 0,
    "moe_router_replay": False,
}
"""Keys (with their defaults) that only the policy-gradient presets read: dpo and rft take
one DPO / SFT step per batch, so a non-default value would be silently ignored; refused."""


@dataclass
class OptimizerConfig:
    """The actor's AdamW (the critic's shares all but its learning rate, ``critic.lr``)."""

    lr: float = knob(1e-5, gt=0)
    """Actor AdamW learning rate (constant)."""
    weight_decay: float = knob(0.01, ge=0)
    """AdamW decoupled weight decay (actor and critic)."""
    betas: tuple[float, float] = knob((0.9, 0.999), ge=0, lt=1)
    """AdamW betas (actor and critic)."""
    grad_clip: float = knob(1.0, ge=0)
    """Max global gradient L2 norm (actor and critic); 0 disables clipping."""

    def validate(self) -> None:
        raise_problems(
            [
                *field_problems(self, "learner.optimizer"),
                None
                if len(self.betas) == 2
                else f"learner.optimizer.betas: must be two numbers in [0, 1), got {self.betas!r}",
            ]
        )


@dataclass
class UpdateConfig:
    """How each train batch becomes optimizer steps."""

    micro_batch_size: int = knob(8, ge=1)
    """Samples per forward/backward on one rank; gradients accumulate over micro-batches."""
    epochs: int = knob(1, ge=1)
    """Passes over each train batch (PPO epochs)."""
    num_mini_batches: int = knob(1, ge=1)
    """Optimizer steps per epoch: the batch is split into this many contiguous mini-batches."""

    def validate(self) -> None:
        raise_problems(field_problems(self, "learner.update"))


@dataclass
class LossConfig:
    """The policy loss's terms: PPO clipping, aggregation, entropy bonus and the correction for
    samples from older weights (which loss: ``learner.policy_loss``)."""

    clip_ratio_low: float = knob(0.2, gt=0, lt=1)
    """PPO lower clip: the ratio is clipped at 1 - clip_ratio_low."""
    clip_ratio_high: float = knob(0.2, gt=0)
    """PPO upper clip: 1 + clip_ratio_high (raise it for clip-higher / DAPO, e.g. 0.28)."""
    clip_ratio_c: float | None = knob(3.0, gt=1)
    """Dual-clip bound for negative advantages (> 1); null disables dual-clip."""
    agg_mode: LossAggMode = "token-mean"
    """How token losses become one scalar."""
    entropy_coef: float = knob(0.0, ge=0)
    """Weight of the entropy bonus (loss -= entropy_coef * entropy)."""
    off_policy: Literal["none", "tis", "decoupled"] = "none"
    """Correction for samples from older weights: none, tis (truncated importance sampling
    against the rollout log-probs) or decoupled (decoupled PPO, proximal log-probs recomputed)."""
    is_cap: float = knob(2.0, gt=0)
    """Truncation of the importance weights (tis); decoupled uses it times 5 as a safety cap."""

    def validate(self) -> None:
        raise_problems(field_problems(self, "learner.loss"))


@dataclass
class AdvantageConfig:
    """How advantages are computed (which estimator: ``learner.advantage_estimator``)."""

    norm_by_std: bool = True
    """GRPO: divide by the group std (False: Dr. GRPO, mean-centred only)."""
    norm_eps: float = knob(1e-6, gt=0)
    """Added to the std GRPO advantages are divided by (verl's 1e-6; TRL's is 1e-4)."""
    gamma: float = knob(1.0, ge=0, le=1)
    """GAE discount (PPO)."""
    lam: float = knob(1.0, ge=0, le=1)
    """GAE lambda (PPO)."""

    def validate(self) -> None:
        raise_problems(field_problems(self, "learner.advantage"))


@dataclass
class KLConfig:
    """The KL to the frozen reference model."""

    coef: float = knob(0.0, ge=0)
    """Weight of the KL to the reference model (needs use_reference when > 0)."""
    estimator: KLEstimator = "k3"
    """KL estimator: k1, k2 (mse), k3 (low_var_kl) or abs."""
    mode: Literal["loss", "reward"] = "loss"
    """Where KL enters: "loss" (a loss term) or "reward" (a per-token reward penalty; PPO)."""
    use_reference: bool = False
    """Load a frozen copy of the initial actor as the KL reference (algorithm dpo always
    loads it; see ``needs_reference``)."""

    def validate(self) -> None:
        raise_problems(
            [
                *field_problems(self, "learner.kl"),
                "learner.kl.coef > 0 needs learner.kl.use_reference: true"
                if self.coef > 0 and not self.use_reference
                else None,
            ]
        )


@dataclass
class CriticConfig:
    """The value model (PPO / advantage_estimator gae); its ranks: ``learner.topology``."""

    lr: float = knob(1e-5, gt=0)
    """Critic AdamW learning rate (PPO)."""
    value_clip: float | None = knob(0.5, gt=0)
    """Critic value clip range around the rollout-time values; null disables it (PPO)."""

    def validate(self) -> None:
        raise_problems(field_problems(self, "learner.critic"))


@dataclass
class OverlongConfig:
    """DAPO's overlong reward shaping, counted from the sampling limit
    (``coordinator.sampling.max_new_tokens``)."""

    buffer: int = knob(0, ge=0)
    """DAPO overlong shaping: responses longer than max_new_tokens - buffer get a linear
    penalty down to -penalty_factor at max_new_tokens; 0 disables it."""
    penalty_factor: float = knob(1.0, ge=0)
    """The overlong penalty at max_new_tokens (DAPO's penalty_factor)."""

    def validate(self) -> None:
        raise_problems(field_problems(self, "learner.overlong"))


@dataclass
class DPOConfig:
    """Online DPO (``algorithm: dpo``): each group's best vs worst response."""

    beta: float = knob(0.1, gt=0)
    """Online DPO (algorithm dpo): strength of the implicit KL to the reference."""
    loss_type: DPOLossType = "sigmoid"
    """Online DPO: the loss on each pair's margin, as ``preference.dpo_loss_type``."""

    def validate(self) -> None:
        raise_problems(field_problems(self, "learner.dpo"))


@dataclass
class RFTConfig:
    """Rejection-sampling fine-tuning (``algorithm: rft``)."""

    threshold: float = knob(1.0, finite=True)
    """RFT (algorithm rft): responses with reward >= this are kept for the SFT step."""

    def validate(self) -> None:
        raise_problems(field_problems(self, "learner.rft"))


@dataclass
class TopologyConfig:
    """Where the learner runs: device, threads, ranks per node (actor and critic), the
    devices they take and the nodes they span."""

    device: str = knob("cpu", free="cpu or cuda[:N], checked below")
    """Torch device: "cpu", or "cuda" (each rank uses cuda:LOCAL_RANK)."""
    num_threads: int = knob(1, ge=1)
    """Torch intra-op threads of this process."""
    nproc_per_node: int = knob(1, ge=1)
    """Learner ranks torchrun starts (FSDP2 data-parallel shards); with critic_nproc_per_node
    > 0, the actor ranks (actor, reference, actor optimizer)."""
    devices: list[str] = knob(
        default_factory=list, free="CUDA device ids, counted against the ranks below"
    )
    """CUDA devices of the learner processes, e.g. ["0", "1"] (their CUDA_VISIBLE_DEVICES;
    empty: inherit); with critic_devices set, the actor ranks' devices, one per rank."""
    critic_nproc_per_node: int = knob(0, ge=0)
    """Critic ranks on their own process group (seed §1.3): torchrun then starts
    nproc_per_node + this many ranks, the last ones holding only the critic and its optimizer,
    so critic and actor updates run at the same time. 0: the critic lives on every learner
    rank. > 0 needs a critic (algorithm ppo / advantage_estimator gae)."""
    critic_devices: list[str] = knob(
        default_factory=list, free="CUDA device ids, counted against the ranks below"
    )
    """The critic ranks' CUDA devices, e.g. ["2", "3"], one per critic rank; the learner's
    processes then see devices followed by critic_devices and each rank takes the device of
    its local rank (needs devices set). Empty: the critic ranks take the devices after the
    actor ranks' in whatever the learner sees."""
    nnodes: int = knob(1, ge=1)
    """Hosts the learner spans (torchrun's multi-node rendezvous): each host starts
    nproc_per_node (+ critic) ranks with its own node_rank; 1: a single host (--standalone)."""
    node_rank: int = knob(0, ge=0)
    """This host's index among the learner's nnodes (node 0 holds rank 0, which serves)."""
    rdzv_endpoint: str = knob("", free="host:port, checked below when nnodes > 1")
    """host:port of the rendezvous (node 0's address, reachable from every node) when
    nnodes > 1."""
    local_addr: str = knob("", free="a host address, resolved by torchrun")
    """This node's address as the other nodes reach it (torchrun --local-addr; empty: its
    hostname). Set it where the hostname does not resolve to that address."""

    @classmethod
    def upgrade_raw(cls, data: dict[str, Any]) -> Iterator[tuple[str, str]]:
        """Old forms the loader still takes: a comma-separated devices string ("0,1")."""
        for key in ("devices", "critic_devices"):
            value = data.get(key)
            if isinstance(value, str):
                data[key] = [d.strip() for d in value.split(",") if d.strip()]
                yield (
                    key,
                    (
                        f"is now a list of devices ({data[key]!r}); the comma-separated string "
                        "still works, for now"
                    ),
                )

    @property
    def num_ranks(self) -> int:
        """Learner processes torchrun starts: actor ranks plus critic ranks."""
        return self.nproc_per_node + self.critic_nproc_per_node

    @property
    def visible_devices(self) -> str:
        """CUDA_VISIBLE_DEVICES of the learner processes (actor devices, then critic ones)."""
        return ",".join([*self.devices, *self.critic_devices])

    def validate(self) -> None:
        raise_problems([*field_problems(self, "learner.topology"), *self._problems()])

    def _problems(self) -> Iterator[str | None]:
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            yield f"learner.topology.device must be 'cpu' or 'cuda[:N]', got {self.device!r}"
        if self.nnodes >= 1 and not 0 <= self.node_rank < self.nnodes:
            yield (
                f"learner.topology.node_rank must be in [0, {self.nnodes - 1}], "
                f"got {self.node_rank}"
            )
        if self.nnodes > 1:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit():
                yield (
                    "learner.topology.rdzv_endpoint: host:port of node 0's rendezvous is "
                    "required when learner.topology.nnodes > 1, got "
                    f"{self.rdzv_endpoint!r}"
                )
        if not self.critic_devices:
            return
        if self.critic_nproc_per_node == 0:
            yield (
                "learner.topology.critic_devices needs learner.topology.critic_nproc_per_node > 0"
            )
            return
        for key, value, count in (
            ("devices", self.devices, self.nproc_per_node),
            ("critic_devices", self.critic_devices, self.critic_nproc_per_node),
        ):
            if len(value) != count:
                yield (
                    f"learner.topology.{key} must list one device per rank ({count}) when "
                    f"learner.topology.critic_devices is set, got {value!r}"
                )


@dataclass
class LearnerConfig:
    """The learner: actor (plus critic and reference when needed), optimizer and RL loss."""

    RENAMED_KEYS = {
        "dpo_beta": "dpo.beta",
        "dpo_loss_type": "dpo.loss_type",
        "rft_threshold": "rft.threshold",
        "lr": "optimizer.lr",
        "weight_decay": "optimizer.weight_decay",
        "betas": "optimizer.betas",
        "grad_clip": "optimizer.grad_clip",
        "micro_batch_size": "update.micro_batch_size",
        "ppo_epochs": "update.epochs",
        "num_mini_batches": "update.num_mini_batches",
        "clip_ratio_low": "loss.clip_ratio_low",
        "clip_ratio_high": "loss.clip_ratio_high",
        "clip_ratio_c": "loss.clip_ratio_c",
        "loss_agg_mode": "loss.agg_mode",
        "entropy_coef": "loss.entropy_coef",
        "off_policy": "loss.off_policy",
        "is_cap": "loss.is_cap",
        "norm_adv_by_std": "advantage.norm_by_std",
        "norm_adv_eps": "advantage.norm_eps",
        "gamma": "advantage.gamma",
        "lam": "advantage.lam",
        "kl_coef": "kl.coef",
        "kl_estimator": "kl.estimator",
        "kl_mode": "kl.mode",
        "use_reference": "kl.use_reference",
        "critic_lr": "critic.lr",
        "value_clip": "critic.value_clip",
        "overlong_buffer": "overlong.buffer",
        "overlong_penalty_factor": "overlong.penalty_factor",
        "device": "topology.device",
        "num_threads": "topology.num_threads",
        "nproc_per_node": "topology.nproc_per_node",
        "devices": "topology.devices",
        "critic_nproc_per_node": "topology.critic_nproc_per_node",
        "critic_devices": "topology.critic_devices",
        "nnodes": "topology.nnodes",
        "node_rank": "topology.node_rank",
        "rdzv_endpoint": "topology.rdzv_endpoint",
        "local_addr": "topology.local_addr",
    }
    """Old flat key -> its place now (both under ``learner.``); the loader moves them."""

    algorithm: Literal["grpo", "ppo", "dpo", "rft"] = "grpo"
    """Preset: "grpo" (group-normalised outcome, PPO clip) or "ppo" (GAE with a critic, PPO
    clip), whose pieces advantage_estimator and policy_loss override; "dpo" (online DPO: each
    group's best vs worst response, against the frozen reference) or "rft" (rejection-sampling
    fine-tuning: SFT on the responses scoring >= rft.threshold), one step per batch."""
    advantage_estimator: str = knob(
        "", free="a built-in name or package.module:function (pluggable), checked below"
    )
    """Empty (the preset's), a built-in (gae, grpo, dr_grpo, rloo, reinforce_plus_plus,
    reinforce_plus_plus_baseline, remax) or "package.module:function" (imported at learner
    start). remax makes the coordinator generate one greedy response per prompt."""
    policy_loss: str = knob(
        "ppo_clip", free="a built-in name or package.module:function (pluggable), checked below"
    )
    """A built-in (ppo_clip, gspo, cispo) or "package.module:function" (imported at start)."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """The actor's AdamW."""
    update: UpdateConfig = field(default_factory=UpdateConfig)
    """Micro-batches, epochs and mini-batches of each train batch."""
    loss: LossConfig = field(default_factory=LossConfig)
    """The policy loss's clipping, aggregation, entropy bonus and off-policy correction."""
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    """Advantage normalisation (GRPO) and GAE's gamma and lambda (PPO)."""
    kl: KLConfig = field(default_factory=KLConfig)
    """The KL to the frozen reference model."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The value model (PPO)."""
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    """DAPO's overlong reward shaping."""
    dpo: DPOConfig = field(default_factory=DPOConfig)
    """Online DPO (algorithm dpo)."""
    rft: RFTConfig = field(default_factory=RFTConfig)
    """Rejection-sampling fine-tuning (algorithm rft)."""
    moe_router_replay: bool = False
    """Mixture-of-experts models: the learner's forwards route each token to the experts the
    rollout engine routed it to (R3), so learner and rollout log-probs belong to the same
    computation; the coordinator asks the rollout to report them (needs rollout.engine
    vllm). The router still learns: its softmax weights over those experts are its own."""
    temperature: float = derived(1.0, "coordinator.sampling.temperature", ge=0)
    """Log-prob temperature: coordinator.sampling.temperature, set by the job config (0
    counts as 1); a job file does not set it."""
    max_new_tokens: int = derived(0, "coordinator.sampling.max_new_tokens", ge=0)
    """Response length limit the overlong penalty counts from:
    coordinator.sampling.max_new_tokens, set by the job config; a job file does not set it."""
    seed: int = knob(0, ge=0)
    """Seed of torch's generator (critic head init)."""
    peak_tflops: float | None = knob(None, gt=0)
    """Peak TFLOP/s of one learner device, the denominator of ``perf/mfu``; null: the
    table in ``mfu.py`` by CUDA device name (no default on CPU: MFU is then not reported)."""
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    """Device, threads, ranks, devices and nodes of the learner processes."""
    memory: LearnerMemoryConfig = field(default_factory=LearnerMemoryConfig)
    """Memory tools: precision, activation checkpointing, packing, token-budget
    micro-batches, chunked log-probs, CPU offload (``memory_config.py``)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Low-rank adapters on the actor (rank > 0): the base stays frozen, the optimizer and
    the weight sync hold the adapters only, the reference is the base with adapters off
    (docs/lora.md)."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """Listening socket and transport limits (rank 0 serves)."""
    checkpoint_dir: str = knob("", free="a directory the launcher sets; empty refuses")
    """The only directory checkpoint RPCs write to or read from (deploy/launch.sh sets
    <run dir>/checkpoints); empty refuses them."""

    def validate(self) -> None:
        """Raise ValueError naming the bad fields (each section's ranges at once, then the
        first check between sections that fails)."""
        for section in (
            self.optimizer,
            self.update,
            self.loss,
            self.advantage,
            self.kl,
            self.critic,
            self.overlong,
            self.dpo,
            self.rft,
            self.topology,
            self.memory,
            self.lora,
        ):
            section.validate()
        raise_problems(field_problems(self, "learner"))
        if not self.is_policy_gradient:
            self._refuse_policy_gradient_keys()
        else:
            self._validate_estimator_and_loss()
        if self.overlong.buffer > 0 and not self.overlong.buffer <= self.max_new_tokens:
            raise ValueError(
                f"learner.overlong.buffer ({self.overlong.buffer}) needs learner.max_new_tokens "
                f"(coordinator.sampling.max_new_tokens, the sampling limit) >= it, got "
                f"{self.max_new_tokens}"
            )
        self._validate_critic_ranks()
        if self.lora.enabled and self.is_policy_gradient:
            if self.resolved_advantage_estimator() == "gae":
                raise ValueError(
                    "learner.lora: a critic (algorithm ppo / estimator gae) is not adapted yet; "
                    "train with a critic-free estimator (grpo, rloo, reinforce_plus_plus) or "
                    "set learner.lora.rank: 0"
                )
        if self.lora.enabled and self.moe_router_replay:
            raise ValueError(
                "learner.lora: mixture-of-experts experts are not adapted; set "
                "learner.moe_router_replay: false or learner.lora.rank: 0"
            )

    @property
    def is_policy_gradient(self) -> bool:
        """grpo / ppo (advantages and a policy loss), not a preference preset (dpo / rft)."""
        return self.algorithm in PRESET_ESTIMATORS

    @property
    def needs_reference(self) -> bool:
        """Whether the learner loads the frozen reference: kl.use_reference, or online DPO."""
        return self.kl.use_reference or self.algorithm == "dpo"

    def resolved_advantage_estimator(self) -> str:
        """``advantage_estimator``, or the preset's when it is empty (policy-gradient presets)."""
        if not self.is_policy_gradient:
            raise ValueError(f"learner.algorithm {self.algorithm!r} has no advantage estimator")
        return self.advantage_estimator or PRESET_ESTIMATORS[self.algorithm]

    def _validate_critic_ranks(self) -> None:
        if self.topology.critic_nproc_per_node > 0:
            # A user estimator ("package.module:function") is checked when the learner loads it.
            estimator = self.resolved_advantage_estimator() if self.is_policy_gradient else ""
            builtin_without_critic = estimator in ADVANTAGE_ESTIMATOR_NAMES and estimator != "gae"
            if not estimator or builtin_without_critic:
                raise ValueError(
                    "learner.topology.critic_nproc_per_node > 0 needs a critic (algorithm 'ppo' "
                    f"or advantage_estimator 'gae'), got algorithm {self.algorithm!r}"
                    + (f" with estimator {estimator!r}" if estimator else "")
                )

    def _refuse_policy_gradient_keys(self) -> None:
        why = (
            "one DPO step per batch; its KL strength is learner.dpo.beta"
            if self.algorithm == "dpo"
            else "one SFT step per batch"
        )
        for key, default in POLICY_GRADIENT_ONLY.items():
            value = _dotted(self, key)
            if value != default:
                raise ValueError(
                    f"learner.{key} does not apply to learner.algorithm {self.algorithm!r} "
                    f"({why}): leave it at {default!r}, got {value!r}"
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
            self.kl.mode == "reward"
            and self.kl.coef > 0
            and self.resolved_advantage_estimator() in ("grpo", "grpo_batch_std", "dr_grpo")
        ):
            raise ValueError(
                "learner.kl.mode 'reward' does not apply to the grpo estimators "
                "(GRPO advantages come from sequence scores; use kl.mode 'loss')"
            )


def _dotted(obj: object, key: str) -> object:
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj
