"""The resume matrix on the real learner and engine (in-process twins, the path
test_resume_changes.py runs): for every learner key a resume accepts, a run whose learner
died at step 3 (its newest checkpoint: step 2) is resumed with that key changed, and the
value the resumed learner used is read where it takes effect, never from the config the
test wrote: the optimizers' param groups after the restore and the steps (the restored
optimizer state would bring the saved lr back), the arguments the resumed train steps
handed the loss, advantage, KL, overlong and batching functions (recorded by wrapping them
where the learner calls them), the metrics it reported, the dtype its layers computed in,
what its backward recomputed, where it saved. ``learner.temperature`` and
``learner.max_new_tokens`` change through ``coordinator.sampling``, as a job file changes
them. The multi-turn keys of the coordinator are observed here too: only a real engine and
environment run episodes.

One resume per key (the tiny model trains two steps in well under a second), each on the
base its key acts in: PPO (a critic), GRPO (the group-normalised advantage), online DPO,
RFT, multi-turn. A case turns on what its key needs to act (``kl.coef`` needs the
reference). Keys that cannot be observed in process are in the fake matrix's
``NOT_OBSERVED`` (tests/unit/coordinator/test_resume_matrix.py), which also checks that
every accepted key is observed here, there, or has a reason. ``pytest -s`` prints the table.

Module-level imports stay torch-free: the fake matrix imports ``OBSERVERS`` from here.
"""

from __future__ import annotations

import inspect
import shutil
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hybridflow.coordinator.checkpoint import CheckpointStore
from hybridflow.coordinator.metrics import read_step_lines
from hybridflow.coordinator.resume_policy import Policy, compare, flatten
from tests.resume_observed import NOTHING, ObservedTable, Observer, one

COMMON = (
    "coordinator.num_steps=4",
    "coordinator.prompts_per_step=4",
    "coordinator.group_size=2",
    "coordinator.data_size=16",
    "coordinator.sampling.max_new_tokens=4",
    "coordinator.checkpoint_every=2",
    "coordinator.save_checkpoint=false",
    "coordinator.progress=false",
    "learner.update.micro_batch_size=8",
)
BASES: dict[str, tuple[str, ...]] = {
    "ppo": (*COMMON, "learner.algorithm=ppo"),
    "grpo": COMMON,
    "dpo": (*COMMON, "learner.algorithm=dpo"),
    "rft": (*COMMON, "learner.algorithm=rft"),
    "multi_turn": (
        *COMMON,
        "coordinator.data=builtin:guess",
        "coordinator.multi_turn.env=hybridflow.envs.guess_number:GuessNumberEnv",
    ),
}
CRASH_STEP = 3
"""The crashed run's learner dies on its third train step: the resume continues from step 2."""
RESTORED_STEP = 2

_KL = ("learner.kl.use_reference=true", "learner.kl.coef=0.1")
CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "learner.optimizer.lr": ("ppo", ("learner.optimizer.lr=0.001",)),
    "learner.optimizer.weight_decay": ("ppo", ("learner.optimizer.weight_decay=0.0",)),
    "learner.optimizer.betas": ("ppo", ("learner.optimizer.betas=[0.8, 0.99]",)),
    "learner.optimizer.grad_clip": ("ppo", ("learner.optimizer.grad_clip=0.5",)),
    "learner.critic.lr": ("ppo", ("learner.critic.lr=0.0001",)),
    "learner.critic.value_clip": ("ppo", ("learner.critic.value_clip=null",)),
    "learner.update.micro_batch_size": ("ppo", ("learner.update.micro_batch_size=4",)),
    "learner.update.epochs": ("ppo", ("learner.update.epochs=2",)),
    "learner.update.num_mini_batches": ("ppo", ("learner.update.num_mini_batches=2",)),
    "learner.loss.clip_ratio_low": ("ppo", ("learner.loss.clip_ratio_low=0.1",)),
    "learner.loss.clip_ratio_high": ("ppo", ("learner.loss.clip_ratio_high=0.28",)),
    "learner.loss.clip_ratio_c": ("ppo", ("learner.loss.clip_ratio_c=null",)),
    "learner.loss.agg_mode": ("ppo", ("learner.loss.agg_mode=seq-mean-token-sum",)),
    "learner.loss.entropy_coef": ("ppo", ("learner.loss.entropy_coef=0.01",)),
    "learner.loss.off_policy": ("ppo", ("learner.loss.off_policy=tis",)),
    "learner.loss.is_cap": ("ppo", ("learner.loss.off_policy=tis", "learner.loss.is_cap=3.0")),
    "learner.advantage.norm_by_std": ("grpo", ("learner.advantage.norm_by_std=false",)),
    "learner.advantage.norm_eps": ("grpo", ("learner.advantage.norm_eps=0.001",)),
    "learner.advantage.gamma": ("ppo", ("learner.advantage.gamma=0.9",)),
    "learner.advantage.lam": ("ppo", ("learner.advantage.lam=0.9",)),
    "learner.kl.use_reference": ("ppo", ("learner.kl.use_reference=true",)),
    "learner.kl.coef": ("ppo", _KL),
    "learner.kl.estimator": ("ppo", (*_KL, "learner.kl.estimator=k1")),
    "learner.kl.mode": ("ppo", (*_KL, "learner.kl.mode=reward")),
    "learner.overlong.buffer": ("ppo", ("learner.overlong.buffer=2",)),
    "learner.overlong.penalty_factor": (
        "ppo",
        ("learner.overlong.buffer=2", "learner.overlong.penalty_factor=0.5"),
    ),
    "learner.temperature": ("ppo", ("coordinator.sampling.temperature=0.7",)),
    "learner.max_new_tokens": (
        "ppo",
        ("coordinator.sampling.max_new_tokens=3", "learner.overlong.buffer=2"),
    ),
    "learner.peak_tflops": ("ppo", ("learner.peak_tflops=100",)),
    "learner.topology.num_threads": ("ppo", ("learner.topology.num_threads=2",)),
    "learner.memory.dtype": ("ppo", ("learner.memory.dtype=bfloat16",)),
    "learner.memory.activation_checkpointing": (
        "ppo",
        ("learner.memory.activation_checkpointing=true",),
    ),
    "learner.memory.packing": ("ppo", ("learner.memory.packing=true",)),
    "learner.memory.shared_prompts": ("ppo", ("learner.memory.shared_prompts=false",)),
    "learner.memory.max_tokens_per_micro_batch": (
        "ppo",
        ("learner.memory.max_tokens_per_micro_batch=256",),
    ),
    "learner.memory.logprob_chunk_tokens": ("ppo", ("learner.memory.logprob_chunk_tokens=2",)),
    "learner.memory.full_logits": ("ppo", ("learner.memory.full_logits=true",)),
    "learner.dpo.beta": ("dpo", ("learner.dpo.beta=0.2",)),
    "learner.rft.threshold": ("rft", ("learner.rft.threshold=0.5",)),
    # Every resume here runs from a copy of the crashed run, whose checkpoint_dir is the copy's.
    "learner.checkpoint_dir": ("ppo", ()),
    "reward.format_score": ("grpo", ("reward.format_score=0.5",)),
    "coordinator.multi_turn.max_turns": ("multi_turn", ("coordinator.multi_turn.max_turns=1",)),
    "coordinator.multi_turn.max_total_tokens": (
        "multi_turn",
        ("coordinator.multi_turn.max_total_tokens=3",),
    ),
}
"""Key -> (the base it acts in, the overrides of its resume)."""


# ---------------------------------------------------------------------- what is recorded
class Calls:
    """The arguments (defaults filled in) of every call to the wrapped functions, by name."""

    def __init__(self) -> None:
        self.by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def wrap(self, monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> None:
        """Records the calls to ``owner.name`` (a module's function or class, a class's method)."""
        original = getattr(owner, name)
        signature = inspect.signature(original)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            self.by_name[name].append(dict(bound.arguments))
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, recorded)

    def arg(self, name: str, arg: str) -> object:
        return one(call[arg] for call in self.by_name[name])


@dataclass
class LayerWatch:
    """Forward calls of the actor's first decoder layer and of its first linear layer, with
    gradients on (the train updates'), and the dtypes that linear layer computed in."""

    layer_calls: int = 0
    linear_calls: int = 0
    dtypes: list[str] = field(default_factory=list)

    def attach(self, actor: Any, layer_classes: set[str]) -> None:
        import torch

        layer = next(m for m in actor.modules() if type(m).__name__ in layer_classes)
        linear = next(m for m in layer.modules() if isinstance(m, torch.nn.Linear))

        def on_layer(module: Any, args: Any, output: Any) -> None:
            self.layer_calls += torch.is_grad_enabled()

        def on_linear(module: Any, args: Any, output: Any) -> None:
            if torch.is_grad_enabled():
                self.linear_calls += 1
                self.dtypes.append(str(output.dtype).removeprefix("torch."))

        layer.register_forward_hook(on_layer)
        linear.register_forward_hook(on_linear)


@dataclass
class Resumed:
    """What the resumed run's learner did."""

    worker: Any
    """The resumed ``LearnerWorker`` (its optimizers, reference, peak)."""
    calls: Calls
    watch: LayerWatch
    run_dir: Path
    crashed_dir: Path
    num_threads: int
    """torch's intra-op threads once the resumed learner was built."""

    def metrics(self) -> list[dict[str, Any]]:
        """metrics.jsonl's lines of the steps after the resume."""
        rows = read_step_lines(self.run_dir / "metrics.jsonl")
        return [r for r in rows if r["step"] > RESTORED_STEP]

    def param_groups(self, *optims: str) -> list[dict[str, Any]]:
        return [g for name in optims for g in getattr(self.worker, name).param_groups]


def _arg(function: str, arg: str) -> Observer[Resumed]:
    return Observer(
        f"`{arg}` of the train steps' {function} calls", lambda r: r.calls.arg(function, arg)
    )


def _loss_option(option: str) -> Observer[Resumed]:
    return _arg("PolicyLossOptions", option)


def _advantage_option(option: str) -> Observer[Resumed]:
    return _arg("AdvantageOptions", option)


def _epochs(r: Resumed) -> object:
    """Actor updates per resumed step and mini-batch (a fraction, were they uneven)."""
    updates = r.calls.by_name["actor_update"]
    if not updates:
        return NOTHING
    per_epoch = len(r.metrics()) * len({u["mb"] for u in updates})
    epochs, uneven = divmod(len(updates), per_epoch)
    return len(updates) / per_epoch if uneven else epochs


def _kl_mode(m: dict[str, Any]) -> str:
    if "actor/reward_kl_penalty" in m:
        return "reward"
    return "loss" if "actor/kl_loss" in m else NOTHING


def _saved_under(r: Resumed) -> object:
    """The checkpoint root holding the train state the resumed run saved at its end."""
    last = max(m["step"] for m in r.metrics())
    roots = (r.run_dir / "checkpoints", r.crashed_dir / "checkpoints")
    return one(
        str(root)
        for root in roots
        if (root / CheckpointStore(root).learner_name(last) / "COMPLETE").exists()
    )


OBSERVERS: dict[str, Observer[Resumed]] = {
    "learner.optimizer.lr": Observer(
        "actor AdamW param groups after the run, and actor/lr of each resumed step",
        lambda r: one(
            [
                *(g["lr"] for g in r.param_groups("actor_optim")),
                *(m["actor/lr"] for m in r.metrics()),
            ]
        ),
    ),
    "learner.optimizer.weight_decay": Observer(
        "actor and critic AdamW param groups",
        lambda r: one(g["weight_decay"] for g in r.param_groups("actor_optim", "critic_optim")),
    ),
    "learner.optimizer.betas": Observer(
        "actor and critic AdamW param groups",
        lambda r: one(list(g["betas"]) for g in r.param_groups("actor_optim", "critic_optim")),
    ),
    "learner.critic.lr": Observer(
        "critic AdamW param groups", lambda r: one(g["lr"] for g in r.param_groups("critic_optim"))
    ),
    "learner.optimizer.grad_clip": _arg("clip_grad_norm", "max_norm"),
    "learner.critic.value_clip": _arg("compute_value_loss", "value_clip"),
    "learner.update.micro_batch_size": _arg("plan_step_micro_batches", "micro_batch_size"),
    "learner.update.epochs": Observer("actor updates per step and mini-batch", _epochs),
    "learner.update.num_mini_batches": Observer(
        "distinct mini-batches of the actor updates",
        lambda r: len({u["mb"] for u in r.calls.by_name["actor_update"]}),
    ),
    "learner.loss.clip_ratio_low": _loss_option("clip_ratio_low"),
    "learner.loss.clip_ratio_high": _loss_option("clip_ratio_high"),
    "learner.loss.clip_ratio_c": _loss_option("clip_ratio_c"),
    "learner.loss.agg_mode": _loss_option("loss_agg_mode"),
    "learner.loss.entropy_coef": Observer(
        "the config of the actor updates (UpdateContext.config: the loss reads it inline)",
        lambda r: one(u["self"].config.loss.entropy_coef for u in r.calls.by_name["actor_update"]),
    ),
    "learner.loss.off_policy": _arg("importance_weights", "mode"),
    "learner.loss.is_cap": _arg("importance_weights", "cap"),
    "learner.advantage.norm_by_std": _advantage_option("norm_adv_by_std"),
    "learner.advantage.norm_eps": _advantage_option("std_eps"),
    "learner.advantage.gamma": _advantage_option("gamma"),
    "learner.advantage.lam": _advantage_option("lam"),
    "learner.kl.use_reference": Observer(
        "a KL to the reference computed in the train steps",
        lambda r: r.worker.reference is not None and bool(r.calls.by_name["kl_penalty"]),
    ),
    "learner.kl.coef": Observer(
        "actor/kl_coef of each resumed step", lambda r: one(m["actor/kl_coef"] for m in r.metrics())
    ),
    "learner.kl.estimator": _arg("kl_penalty", "estimator"),
    "learner.kl.mode": Observer(
        "the KL metrics reported (actor/reward_kl_penalty or actor/kl_loss)",
        lambda r: one(_kl_mode(m) for m in r.metrics()),
    ),
    "learner.overlong.buffer": _arg("overlong_penalty", "buffer"),
    "learner.overlong.penalty_factor": _arg("overlong_penalty", "penalty_factor"),
    "learner.temperature": _arg("policy_forward", "temperature"),
    "learner.max_new_tokens": _arg("overlong_penalty", "max_new_tokens"),
    "learner.peak_tflops": Observer(
        "the learner's peak, when each resumed step reports perf/mfu",
        lambda r: one(r.worker.peak_tflops if "perf/mfu" in m else None for m in r.metrics()),
    ),
    "learner.topology.num_threads": Observer(
        "torch's intra-op threads once the resumed learner started", lambda r: r.num_threads
    ),
    "learner.memory.dtype": Observer(
        "output dtype of the actor's first linear layer in the updates",
        lambda r: one(r.watch.dtypes),
    ),
    "learner.memory.activation_checkpointing": Observer(
        "the actor's first layer computed again in the backward",
        lambda r: r.watch.linear_calls > r.watch.layer_calls > 0,
    ),
    "learner.memory.packing": _arg("build_batch", "packed"),
    "learner.memory.shared_prompts": Observer(
        "whether the train steps' build_batch calls could share prompts (`sharing` given)",
        lambda r: r.calls.arg("build_batch", "sharing") is not None,
    ),
    "learner.memory.max_tokens_per_micro_batch": _arg("plan_step_micro_batches", "max_tokens"),
    "learner.memory.logprob_chunk_tokens": _arg("policy_forward", "chunk_tokens"),
    "learner.memory.full_logits": Observer(
        "the train steps' policy_forward calls computed every position's logits "
        "(`chunk_tokens` None)",
        lambda r: r.calls.arg("policy_forward", "chunk_tokens") is None,
    ),
    "learner.dpo.beta": Observer(
        "beta of the DPO steps' PreferenceConfig",
        lambda r: one(c["cfg"].beta for c in r.calls.by_name["preference_step"]),
    ),
    "learner.rft.threshold": _arg("rft_kept", "threshold"),
    "learner.checkpoint_dir": Observer("where the resumed run's last train state is", _saved_under),
    "reward.format_score": Observer(
        "`format_score` of the resumed steps' arith scorer calls (the reward service's scorer, "
        "built from the resumed job's reward section)",
        lambda r: r.calls.arg("score_arith", "format_score"),
    ),
    "coordinator.multi_turn.max_turns": Observer(
        "the most turns of an episode after the resume (episode/turns/max)",
        lambda r: max(int(m["episode/turns/max"]) for m in r.metrics()),
    ),
    "coordinator.multi_turn.max_total_tokens": Observer(
        "the longest trajectory after the resume (response_length/max: cut at the limit)",
        lambda r: max(int(m["response_length/max"]) for m in r.metrics()),
    ),
}
"""Keys read from the resumed twins (the learner's, and the multi-turn ones)."""


# ---------------------------------------------------------------------- the runs
def _config(base: str, run_dir: Path, overrides: tuple[str, ...] = ()) -> Any:
    from hybridflow.job_config import load_job_config

    return load_job_config(
        None, (*BASES[base], f"learner.checkpoint_dir={run_dir / 'checkpoints'}", *overrides)
    )


def _run(model: Path, job: Any, run_dir: Path, resume: bool, twins: Any) -> None:
    """The coordinator's job of ``job`` over ``twins``, as run.py builds it."""
    from hybridflow.coordinator.job import TrainingJob
    from hybridflow.main.coordinator_run import load_dataset

    services = twins.services
    training = TrainingJob(
        job.coordinator,
        services,
        load_dataset(job.coordinator, model, twins.tokenizer).records,
        run_dir,
        None,
        resume,
        run_dir / "checkpoints",
        needs=services.learner.schedule_needs(),
        resolved_config=asdict(job),
    )
    training.run()


@pytest.fixture(scope="module")
def crashed(
    tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Path]:
    """The run dir of a base's crashed run (made once per base)."""
    from hybridflow.errors import Unavailable
    from hybridflow.trainer import twin_services

    made: dict[str, Path] = {}

    def get(base: str) -> Path:
        if base not in made:
            run_dir = tmp_path_factory.mktemp(f"crashed_{base}")
            job = _config(base, run_dir)
            twins = twin_services(tiny_model_path, job.learner)
            train_step, calls = twins.services.learner.train_step, []

            def dies_at_crash_step(samples: Any) -> Any:
                calls.append(1)
                if len(calls) == CRASH_STEP:
                    raise Unavailable("the learner died")
                return train_step(samples)

            twins.services.learner.train_step = dies_at_crash_step
            with pytest.raises(Unavailable):
                _run(tiny_model_path, job, run_dir, resume=False, twins=twins)
            assert CheckpointStore(run_dir / "checkpoints").complete_steps() == [RESTORED_STEP]
            made[base] = run_dir
        return made[base]

    return get


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObservedTable]:
    observed = ObservedTable("resume matrix (real learner and engine): keys after resume")
    yield observed
    observed.report(tmp_path_factory.mktemp("resume_matrix") / "twin_keys.txt")


def _record(calls: Calls, monkeypatch: pytest.MonkeyPatch) -> None:
    """Wraps the functions the learner's train step hands its settings to."""
    from hybridflow.services.learner import online_preference, updates

    for name in (
        "policy_forward",
        "plan_step_micro_batches",
        "build_batch",
        "importance_weights",
        "kl_penalty",
        "overlong_penalty",
        "compute_value_loss",
        "clip_grad_norm",
        "PolicyLossOptions",
        "AdvantageOptions",
    ):
        calls.wrap(monkeypatch, updates, name)
    calls.wrap(monkeypatch, updates.UpdateContext, "actor_update")
    calls.wrap(monkeypatch, online_preference, "preference_step")
    calls.wrap(monkeypatch, online_preference, "rft_kept")


@pytest.mark.parametrize("key", sorted(CASES))
def test_resumed_run_uses_the_new_value(
    key: str,
    crashed: Callable[[str], Path],
    tiny_model_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    table: ObservedTable,
) -> None:
    import torch

    from hybridflow.services.learner.models import decoder_layer_classes
    from hybridflow.trainer import twin_services

    base, overrides = CASES[key]
    crashed_dir = crashed(base)
    run_dir = tmp_path / "run"
    shutil.copytree(crashed_dir, run_dir)
    old, new = _config(base, crashed_dir), _config(base, run_dir, overrides)
    changes = compare(asdict(old), asdict(new)).changes
    assert any(c.key == key for c in changes), f"{key} is not among the changes: {changes}"
    assert all(c.rule.policy is not Policy.REFUSE for c in changes), changes
    calls, watch = Calls(), LayerWatch()
    threads = torch.get_num_threads()
    from hybridflow.services.reward import rules
    from hybridflow.services.reward.scorers import RewardScorer

    calls.wrap(monkeypatch, rules, "score_arith")  # before the registry binds it
    try:
        twins = twin_services(tiny_model_path, new.learner, reward=RewardScorer(new.reward))
        num_threads = torch.get_num_threads()
        watch.attach(twins.worker.actor, decoder_layer_classes(twins.worker.actor))
        _record(calls, monkeypatch)
        _run(tiny_model_path, new, run_dir, resume=True, twins=twins)
    finally:
        torch.set_num_threads(threads)  # the process's, for the tests after this one
    resumed = Resumed(twins.worker, calls, watch, run_dir, crashed_dir, num_threads)
    assert [m["step"] for m in resumed.metrics()] == [3, 4]
    expected = flatten(asdict(new))[key]
    observed = OBSERVERS[key].read(resumed)
    table.add(key, key, expected, observed, OBSERVERS[key].source)
    assert observed == expected, f"{key}: resumed with {expected!r}, the learner used {observed!r}"


def test_every_case_has_an_observer() -> None:
    assert set(CASES) == set(OBSERVERS)
