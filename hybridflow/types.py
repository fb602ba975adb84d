"""Domain types shared by every service: plain dataclasses, no torch, no grpc.

Token ids, log-probs and per-token versions are 1-D numpy arrays (int32, float32, int32; see
``hybridflow.arrays``), never lists of Python numbers: the wire codec decodes them as views
over the received bytes and packs them with one concatenation, so no hop walks a batch token
by token. Arrays decoded from the wire are read-only. Lists are accepted at construction and
converted once. numpy is imported only where arrays are made or compared, so a process that
only scores text (the reward service) does not load it. Nothing in this module knows about
processes or sockets.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from hybridflow.arrays import FloatArray, MaskArray, RoutingArray, TokenArray

FinishReason = Literal["stop", "length"]


def arrays_equal(a: Any, b: Any) -> bool:
    """Dataclass equality that compares array fields by value."""
    import numpy as np

    if type(a) is not type(b):
        return NotImplemented  # type: ignore[no-any-return]
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if x is None or y is None or not np.array_equal(x, y):
                return False
        elif x != y:
            return False
    return True


@dataclass(frozen=True)
class SamplingParams:
    """How a rollout engine samples completions for one request."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    top_k: int = 0
    """Sample among the k most likely tokens only (before top-p); 0 means off."""
    max_new_tokens: int = 16
    """Upper bound on generated tokens per completion."""
    n: int = 1
    """Completions per prompt (the GRPO group size)."""
    seed: int | None = None
    """Seed for this request's sampler; None draws from the engine's generator."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra token ids that end a completion (EOS always does)."""
    return_routed_experts: bool = False
    """Report each completion's ``routed_experts`` (mixture-of-experts models; router replay)."""

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        if not self.temperature >= 0.0:
            raise ValueError(f"sampling.temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"sampling.top_k must be >= 0 (0: off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.n < 1:
            raise ValueError(f"sampling.n must be >= 1, got {self.n}")


@dataclass(eq=False)
class Completion:
    """One sampled continuation of a prompt, token-in/token-out."""

    token_ids: TokenArray
    """Generated token ids (EOS included when the completion stopped on it)."""
    logprobs: FloatArray
    """Log-prob of each sampled token under the sampling distribution (temperature applied)."""
    finish_reason: FinishReason
    """"stop" (EOS or a stop token) or "length" (hit max_new_tokens)."""
    policy_version: int
    """Version of the weights that generated its first token (the oldest it depends on)."""
    token_versions: TokenArray | None = None
    """Per-token weight versions when weights changed mid-sequence; None when all are
    ``policy_version``."""
    routed_experts: RoutingArray | None = None
    """When the request asked: int16 ``[tokens read, moe layers, top_k]``, the experts each
    token the model read (prompt, then every sampled token but the last) was routed to."""
    loss_mask: MaskArray | None = None
    """A multi-turn trajectory's 0/1 per token of ``token_ids``: 1 where the policy sampled
    the token, 0 on the environment's observation and chat-template tokens (whose
    ``logprobs`` are 0 and ``token_versions`` -1); None when every token was sampled."""

    turn_rewards: FloatArray | None = None
    """Multi-turn: a reward per token of ``token_ids``, each turn's reward on its last policy
    token, 0 elsewhere (the episode's score is their sum); None: one outcome reward."""
    prompt_ids: TokenArray | None = None
    """A multi-turn trajectory's own prompt (the environment's opening messages, rendered
    and tokenised), which the learner trains it after; None: the request's prompt."""

    def __post_init__(self) -> None:
        from hybridflow.arrays import as_floats, as_mask, as_routing, as_tokens

        self.token_ids = as_tokens(self.token_ids)
        if self.prompt_ids is not None:
            self.prompt_ids = as_tokens(self.prompt_ids)
        if self.turn_rewards is not None:
            self.turn_rewards = as_floats(self.turn_rewards)
        self.logprobs = as_floats(self.logprobs)
        if self.token_versions is not None:
            self.token_versions = as_tokens(self.token_versions)
        if self.routed_experts is not None:
            self.routed_experts = as_routing(self.routed_experts)
        if self.loss_mask is not None:
            self.loss_mask = as_mask(self.loss_mask)
            if self.loss_mask.size != self.token_ids.size:
                raise ValueError(
                    f"loss_mask: {self.loss_mask.size} flags for {self.token_ids.size} tokens"
                )

    __eq__ = arrays_equal


@dataclass
class ScoreItem:
    """One response to score; the reward service picks a scorer by ``data_source``."""

    data_source: str
    response: str
    ground_truth: str | None
    prompt: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class ScoreResult:
    """A score, or an error message (then score is 0 and the sample counts as failed)."""

    score: float
    error: str | None = None
    components: dict[str, float] = field(default_factory=dict)
    """Each reward component's own (unweighted) score when ``reward.components`` are
    configured (``score`` is their weighted sum); empty otherwise and on error."""
    outcome: str = ""
    """What the scorer found, named (``Verdict.outcome``: a code scorer's ``passed``,
    ``wrong_answer``, ``timeout``, ...); empty when it names none."""


@dataclass(frozen=True)
class Verdict:
    """What a scorer may return instead of a bare number: the score and a named outcome,
    counted per step in the metrics as ``reward/outcome/<outcome>``."""

    score: float
    outcome: str


@dataclass(eq=False)
class TrainSample:
    """One scored completion as the learner sees it."""

    prompt_ids: TokenArray
    response_ids: TokenArray
    rollout_logprobs: FloatArray
    """Per response token, from the rollout engine (for off-policy correction and metrics)."""
    reward: float
    group_id: int
    """Samples of the same prompt share a group id (GRPO normalises within it)."""
    policy_version: int
    baseline: float | None = None
    """Score of the prompt's greedy response (ReMax's baseline); None when none was generated."""
    routed_experts: RoutingArray | None = None
    """The rollout's routing of prompt + response (``Completion.routed_experts``), which the
    learner replays under ``learner.moe_router_replay``; None when not reported."""
    loss_mask: MaskArray | None = None
    """Multi-turn: 0/1 per response token, 1 on policy tokens (the only ones the losses,
    advantages and off-policy corrections see); None: every response token is the policy's."""
    turn_rewards: FloatArray | None = None
    """Multi-turn: a reward per response token, each turn's reward on the turn's last policy
    token (``reward`` is their sum plus nothing else); None: ``reward`` is an outcome reward
    on the last response token. The advantage estimators see these as token rewards."""

    def __post_init__(self) -> None:
        import numpy as np

        from hybridflow.arrays import as_floats, as_mask, as_routing, as_tokens

        self.prompt_ids = as_tokens(self.prompt_ids)
        self.response_ids = as_tokens(self.response_ids)
        self.rollout_logprobs = as_floats(self.rollout_logprobs)
        if self.routed_experts is not None:
            self.routed_experts = as_routing(self.routed_experts)
        if self.loss_mask is not None:
            self.loss_mask = as_mask(self.loss_mask)
            if self.loss_mask.size != self.response_ids.size:
                raise ValueError(
                    f"loss_mask: {self.loss_mask.size} flags for "
                    f"{self.response_ids.size} response tokens"
                )
            if not self.loss_mask.any():
                raise ValueError("loss_mask: no policy token (nothing to train on)")
        if self.turn_rewards is not None:
            self.turn_rewards = as_floats(self.turn_rewards)
            if self.turn_rewards.size != self.response_ids.size:
                raise ValueError(
                    f"turn_rewards: {self.turn_rewards.size} values for "
                    f"{self.response_ids.size} response tokens"
                )
            if not np.isfinite(self.turn_rewards).all():
                raise ValueError("turn_rewards: not finite")
            if self.loss_mask is not None and (self.turn_rewards[self.loss_mask == 0] != 0).any():
                raise ValueError("turn_rewards: a reward on a token the policy did not sample")
            total = float(self.turn_rewards.sum(dtype=np.float64))
            if abs(total - self.reward) > 1e-4 * max(1.0, abs(self.reward)):
                raise ValueError(f"turn_rewards sum to {total}, the reward is {self.reward}")

    @property
    def num_loss_tokens(self) -> int:
        """Response tokens the losses count: the policy's (all of them without a mask)."""
        return int(self.loss_mask.sum()) if self.loss_mask is not None else len(self.response_ids)

    __eq__ = arrays_equal


@dataclass(frozen=True)
class LearnerNeeds:
    """What the schedule must know of the learner before its first step, asked once: the
    learner's config fixes it for the whole run."""

    greedy_baseline: bool = False
    """Samples carry their prompt's greedy baseline score (ReMax): the schedule generates and
    scores one greedy response per prompt."""
    routed_experts: bool = False
    """Samples carry the rollout's MoE routing (the learner replays it)."""
    versions_per_step: int = 1
    """Policy versions one train step adds (optimizer steps: ``ppo_epochs *
    num_mini_batches``, 1 for dpo and rft): the staleness bound's unit of a step."""


@dataclass
class TrainStepResult:
    """What one learner optimizer step reports."""

    policy_version: int
    """Learner version after the step (rises by one per optimizer step)."""
    metrics: dict[str, float]
    """verl-style names: actor/pg_loss, actor/entropy, actor/ppo_kl, critic/vf_loss, ..."""
    publish_started: bool = False
    """The learner began the step's publish itself (``TrainsAhead.send_train_step`` with
    replicas to publish to); False: the caller publishes."""


@dataclass
class RolloutStatus:
    """What a rollout replica serves and has done."""

    model: str
    engine: str
    policy_version: int
    eos_token_id: int
    vocab_size: int
    num_requests: int = 0
    num_generated_tokens: int = 0
    tensor_parallel_size: int = 1
    engine_steps: int = 0
    """Engine progress: rises with every engine step and weight receive/apply (a replica
    holding a request whose count stands still made no progress; ``coordinator.liveness``)."""
    num_active_requests: int = 0
    """Requests the replica holds now (waiting for its engine or generating)."""


@dataclass(frozen=True)
class LearnerInfo:
    """What the learner serves and needs from the coordinator (its ``GetInfo``)."""

    model: str
    """Model checkpoint path or builtin spec."""
    algorithm: str
    policy_version: int
    world_size: int
    """Ranks of the SPMD group."""
    needs_greedy_baseline: bool
    """The coordinator sends each prompt's greedy baseline score (ReMax)."""
    needs_routed_experts: bool
    """The coordinator sends each completion's routed experts (learner.moe_router_replay)."""
    versions_per_step: int
    """Policy versions one TrainStep adds (its optimizer steps)."""


@dataclass
class WeightUpdateReport:
    """Result of sending or applying one set of weights."""

    policy_version: int
    num_bytes: int
    duration_s: float
