"""The contract every rollout engine keeps (``hf``, ``vllm``; a new one such as SGLang).

An engine turns token-id prompts into completions and takes new weights. What it must give,
whichever engine it is, is checked by one conformance suite,
``tests/integration/test_engine_conformance.py``, run over every engine in the registry
(``engines.py``):

- for each prompt, ``params.n`` completions: the sampled token ids, the log-prob of each
  under the sampling distribution (temperature applied, before top-k and top-p: those two
  truncate what is drawn, in that order, not the reported log-prob; an engine that cannot
  report them that way, vllm, refuses ``top_k > 0`` and ``top_p < 1`` naming the field), a
  finish reason ("stop" on a stop or EOS token, which is kept; "length" at
  ``max_new_tokens``) and the policy version the completion started on;
- log-probs equal to a full forward of the same weights (the learner's recomputation);
- ``load_weights`` takes a whole HF state dict (or part of one) and its version, and later
  completions carry that version and those weights' log-probs;
- with ``between_steps`` set (``in_flight_weights: continue_new``), weights arriving
  mid-request apply at the next decode step and completions carry per-token versions;
- ``should_stop`` returning True ends generation with ``Cancelled`` (its steps counted) and
  leaves the engine serving the next request;
- every member below is there on every engine (callers never test for one): an engine whose
  worker processes can die reports it (``dead_reason``, ``on_dead``), one that cannot is
  never dead; ``close`` ends any engine when its replica ends.

Knows nothing of sockets, protos or any one engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from hybridflow.arrays import FloatArray, TokenArray
from hybridflow.services.rollout.requests import ShouldStop
from hybridflow.types import Completion, SamplingParams

if TYPE_CHECKING:
    import torch

    from hybridflow.resharding.layout import ReplicaLayout
    from hybridflow.weights.spec import GroupSpec


StagedWeights = Sequence[tuple[str, "torch.Tensor"]] | None
"""Named tensors to load, or None: the engine's weight-sync receiver staged them itself."""


@runtime_checkable
class Engine(Protocol):
    """What a generation engine offers (HFEngine, VLLMEngine). ``isinstance`` checks that
    every member is there (the conformance suite does), not their signatures."""

    policy_version: int
    eos_token_id: int
    vocab_size: int
    tensor_parallel_size: int

    def generate(
        self,
        prompts: Sequence[TokenArray],
        params: SamplingParams,
        should_stop: ShouldStop | None = None,
    ) -> list[list[Completion]]: ...

    def load_weights(self, named_tensors: StagedWeights, policy_version: int) -> None: ...

    def check_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> object: ...

    def weight_layout(self) -> ReplicaLayout:
        """How the engine places the learner's parameters (reported at weight-sync join)."""
        ...

    def join_weight_sync(self, spec: GroupSpec, replica_index: int) -> str:
        """Join the learner's torch.distributed weight-sync group; the plan hash."""
        ...

    def receive_weights(self) -> tuple[StagedWeights, int]:
        """Receive one sync over the group: (weights to stage, bytes received)."""
        ...

    def probe_logprobs(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> FloatArray:
        """Log-probs of ``response_ids`` after ``prompt_ids`` under the weights served now,
        temperature 1 (the delivery probe); ValueError for ids outside the vocabulary."""
        ...

    between_steps: Callable[[], tuple[StagedWeights, int] | None] | None

    @property
    def dead_reason(self) -> str | None:
        """Why the engine can serve no more (one of its worker processes died), else None;
        once set it stays, and calls that need the workers raise ``Unavailable`` naming it.
        An engine without worker processes (hf: the model runs in this process) is never
        dead: always None."""
        ...

    def on_dead(self, callback: Callable[[str], None]) -> None:
        """Have ``callback(dead_reason)`` called once when the engine dies (from a watcher
        thread), or at once if it already has; replaces an earlier callback. An engine
        without worker processes never dies that way: a no-op."""
        ...

    def close(self) -> None:
        """End the engine when its replica ends: its worker processes stopped (their exits
        are no death: ``on_dead`` is not called) and the files it made removed; nothing is
        called on it afterwards. An engine that holds nothing beyond this process's memory
        (hf): a no-op."""
        ...
