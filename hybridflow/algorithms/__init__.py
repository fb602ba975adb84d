"""RL math as pure tensor functions: advantages, policy/value losses, KL, entropy, log-probs.

``registry`` names the advantage estimators and policy losses the learner config picks
(built-ins, or user functions by import path).

Every function here takes tensors and returns tensors. Nothing in this package knows about
models, devices, processes, ranks or the wire: the learner worker feeds it tensors (and, under
data parallelism, global normalisers so that sums over ranks equal the single-process value).
"""

from hybridflow.algorithms.advantages import (
    gae_advantages,
    grpo_outcome_advantages,
    last_token_scores,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    rloo_outcome_advantages,
)
from hybridflow.algorithms.aggregation import LOSS_AGG_MODES, agg_loss, masked_mean_contribution
from hybridflow.algorithms.entropy import entropy_from_logits
from hybridflow.algorithms.kl import KL_ESTIMATORS, apply_kl_penalty, kl_penalty
from hybridflow.algorithms.logprobs import logprobs_from_logits
from hybridflow.algorithms.masked import masked_mean, masked_var, masked_whiten
from hybridflow.algorithms.overlong import overlong_penalty
from hybridflow.algorithms.policy_loss import PolicyLossOutput, compute_policy_loss
from hybridflow.algorithms.seq_policy_losses import (
    compute_policy_loss_cispo,
    compute_policy_loss_gspo,
)
from hybridflow.algorithms.value_loss import ValueLossOutput, compute_value_loss

__all__ = [
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "PolicyLossOutput",
    "ValueLossOutput",
    "agg_loss",
    "apply_kl_penalty",
    "compute_policy_loss",
    "compute_policy_loss_cispo",
    "compute_policy_loss_gspo",
    "compute_value_loss",
    "entropy_from_logits",
    "gae_advantages",
    "grpo_outcome_advantages",
    "kl_penalty",
    "last_token_scores",
    "logprobs_from_logits",
    "masked_mean",
    "masked_mean_contribution",
    "masked_var",
    "masked_whiten",
    "overlong_penalty",
    "reinforce_plus_plus_advantages",
    "reinforce_plus_plus_baseline_advantages",
    "rloo_outcome_advantages",
]
