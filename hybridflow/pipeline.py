"""``RLDataPipeline``: the seed's programming model (§1.1), declared stage by stage.

    pipeline = RLDataPipeline("deploy/configs/quickstart.yaml")
    pipeline.add_stage("generate", "builtin:tiny", num_gpus=4)
    pipeline.add_stage("reward", "rule", weight=0.5)
    pipeline.add_stage("reward", "builtin:tiny-rm", num_gpus=2, weight=0.5)
    pipeline.add_stage("train", "grpo", num_gpus=8)
    summary = pipeline.run()            # the services deploy/launch.sh starts, same schedule
    pipeline.to_config("job.yaml")      # or: deploy/launch.sh --config job.yaml, the same run

A pipeline is a base job config plus the overrides its stages imply (``overrides()``): the
Python and the YAML ways are one thing, checked by the same loader. Stages:

- ``generate``: the policy checkpoint (a path, ``builtin:tiny``, ``MockActor()``);
  ``num_gpus`` rollout replicas with one GPU each (``tensor_parallel_size`` GPUs each when
  given); ``engine`` (hf / vllm), ``replicas`` on CPU.
- ``reward`` (one or several): a rule (``"rule"``: each item's data-source scorer, or a
  data-source name), or a reward model (a checkpoint directory or ``builtin:tiny-rm``) on
  ``num_gpus`` GPU; ``weight`` and ``data_sources`` (the stage applies only to those) decide
  how stages combine per sample; each stage's score is in the metrics (``reward/<name>/mean``).
- ``train``: an algorithm preset (grpo, ppo, dpo, rft) or a dict of learner settings;
  ``num_gpus`` learner ranks (FSDP2), ``num_processes`` CPU ranks.
- ``critic``: PPO's critic (the ppo preset) on ``num_gpus`` ranks of its own
  (``num_processes`` on CPU; none: inside the learner's ranks); ``lr`` its learning rate.
- ``reference``: a frozen reference for a KL term (``kl_coef``).

Each role gets its own GPUs (seed §1.3): ids are handed out in the order generate, train,
critic, reward. What this machine cannot honour (GPUs on a machine without one, more GPUs
than it has) is kept as one line each in ``notices`` and printed by ``run``, never an
error. Imports neither torch nor gRPC.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STAGE_KINDS = ("generate", "reward", "train", "critic", "reference")
ALGORITHM_PRESETS = ("grpo", "ppo", "dpo", "rft")


@dataclass
class Stage:
    """One declared stage."""

    kind: str
    component: Any
    num_gpus: int
    options: dict[str, Any] = field(default_factory=dict)


def gpu_count() -> int:
    """NVIDIA GPUs this machine shows (``/dev/nvidia<N>``), honouring CUDA_VISIBLE_DEVICES;
    0 without any. No torch import."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    return len(list(Path("/dev").glob("nvidia[0-9]*")))


class RLDataPipeline:
    """Stages declared in a few lines; runs as the services ``deploy/launch.sh`` starts."""

    def __init__(self, base: str | Path | None = None, gpus: int | None = None) -> None:
        """``base``: the job YAML the stages modify (None: the built-in defaults).
        ``gpus``: GPUs to plan for (None: what this machine shows)."""
        self.base = str(base) if base is not None else None
        self.gpus = gpu_count() if gpus is None else gpus
        self.stages: list[Stage] = []
        self._settings: list[str] = []
        self.notices: list[str] = []
        """What this machine cannot honour, one line each (filled by ``overrides``)."""
        self._devices: dict[int, list[int]] = {}

    # ------------------------------------------------------------------ declaring
    def add_stage(
        self, kind: str, component: Any = None, num_gpus: int = 0, **options: Any
    ) -> RLDataPipeline:
        """Declares a stage (see the module doc); returns the pipeline for chaining."""
        if kind not in STAGE_KINDS:
            raise ValueError(f"add_stage: kind must be one of {STAGE_KINDS}, got {kind!r}")
        if not isinstance(num_gpus, int) or isinstance(num_gpus, bool) or num_gpus < 0:
            raise ValueError(f"add_stage({kind!r}): num_gpus must be an integer >= 0")
        if kind != "reward" and any(s.kind == kind for s in self.stages):
            raise ValueError(f"add_stage: only one {kind!r} stage (reward stages may repeat)")
        self.stages.append(Stage(kind, component, num_gpus, dict(options)))
        return self

    def set(self, key: str, value: Any) -> RLDataPipeline:
        """Any job setting by its dotted key (``coordinator.num_steps``), applied last."""
        self._settings.append(f"{key}={_yaml_value(value)}")
        return self

    # ------------------------------------------------------------------ the config
    def overrides(self) -> list[str]:
        """The ``--set`` overrides the stages and settings imply, in order; refreshes
        ``notices``."""
        self.notices = []
        kinds = {s.kind for s in self.stages}
        for needed in ("generate", "train"):
            if needed not in kinds:
                raise ValueError(f"RLDataPipeline: a {needed!r} stage is required")
        out: list[str] = []
        rewards = [s for s in self.stages if s.kind == "reward"]
        self._devices = self._allocate_devices()
        for stage in self.stages:
            if stage.kind == "generate":
                out += self._generate(stage)
            elif stage.kind == "train":
                out += self._train(stage)
            elif stage.kind == "critic":
                out += self._critic(stage)
            elif stage.kind == "reference":
                out += self._reference(stage)
        if rewards:
            out.append(f"reward.components={json.dumps(self._reward_components(rewards))}")
        return [*out, *self._settings]

    def to_config(self, path: str | Path | None = None) -> Any:
        """The job config (``JobConfig``, validated); with ``path`` also written there as the
        YAML ``deploy/launch.sh --config`` takes."""
        from hybridflow.config.loader import dump_yaml
        from hybridflow.job_config import load_job_config

        job = load_job_config(self.base, self.overrides())
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            dump_yaml(job, Path(path))
        return job

    def run(self, run_dir: str | Path | None = None, timeout_s: float | None = None) -> Any:
        """Writes the config into the run dir and runs it with ``deploy/launch.sh``'s
        launcher (services, supervision, checkpoints); returns summary.json as a dict.
        RuntimeError naming the run dir when the launch fails."""
        job = self.to_config()
        run = Path(run_dir or Path(job.deploy.run_root) / time.strftime("%Y%m%d_%H%M%S"))
        run.mkdir(parents=True, exist_ok=True)
        config = run / "pipeline.yaml"
        self.to_config(config)
        for line in self.notices:
            print(f"pipeline: {line}", file=sys.stderr)
        command = [
            sys.executable,
            "-m",
            "hybridflow.deploy.launch",
            "--config",
            str(config),
            "--run-dir",
            str(run),
        ]
        rc = subprocess.run(command, timeout=timeout_s, check=False).returncode
        summary = run / "summary.json"
        if rc != 0 or not summary.is_file():
            raise RuntimeError(f"pipeline run failed (exit {rc}); see {run}")
        return json.loads(summary.read_text())

    # ------------------------------------------------------------------ devices
    def _allocate_devices(self) -> dict[int, list[int]]:
        """Disjoint GPU ids per stage (by ``id``), in the order generate, train, critic,
        reward stages: each role on its own devices (seed §1.3). More GPUs asked than the
        machine has: ids wrap around (shared), said in one notice. No GPU: nothing."""
        if not self.gpus:
            return {}
        order = ("generate", "train", "critic", "reward")
        asking = [s for kind in order for s in self.stages if s.kind == kind and s.num_gpus]
        total = sum(s.num_gpus for s in asking)
        if total > self.gpus:
            self.notices.append(
                f"stages ask for {total} GPUs, this machine has {self.gpus}: devices are "
                "shared between roles"
            )
        out: dict[int, list[int]] = {}
        next_id = 0
        for stage in asking:
            out[id(stage)] = [(next_id + i) % self.gpus for i in range(stage.num_gpus)]
            next_id += stage.num_gpus
        return out

    def _gpus_for(self, stage: Stage) -> list[int]:
        """The GPU ids a stage gets; none (with a notice) where the machine has none."""
        if stage.num_gpus and not self.gpus:
            self.notices.append(
                f"{stage.kind}: num_gpus={stage.num_gpus} but this machine has no GPU: runs on CPU"
            )
        return self._devices.get(id(stage), [])

    # ------------------------------------------------------------------ stages
    def _generate(self, stage: Stage) -> list[str]:
        o = dict(stage.options)
        out = [f"model={stage.component}"] if stage.component is not None else []
        if "engine" in o:
            out.append(f"rollout.engine={o.pop('engine')}")
        tp = int(o.pop("tensor_parallel_size", 1))
        gpus = self._gpus_for(stage)
        if gpus:
            replicas = max(1, len(gpus) // tp)
            devices = [",".join(map(str, gpus[r * tp : (r + 1) * tp])) for r in range(replicas)]
            out += [
                "rollout.device=cuda",
                f"rollout.tensor_parallel_size={tp}",
                f"rollout.replicas={replicas}",
                f"rollout.devices={json.dumps(devices)}",
            ]
        elif "replicas" in o:
            out.append(f"rollout.replicas={int(o.pop('replicas'))}")
        o.pop("replicas", None)
        return out + [f"rollout.{k}={_yaml_value(v)}" for k, v in o.items()]

    def _train(self, stage: Stage) -> list[str]:
        o = dict(stage.options)
        out: list[str] = []
        component = stage.component
        if isinstance(component, dict):
            o = {**component, **o}
        elif component is not None:
            if component not in ALGORITHM_PRESETS:
                raise ValueError(
                    f"train stage: component must be one of {ALGORITHM_PRESETS} or a dict of "
                    f"learner settings, got {component!r}"
                )
            out.append(f"learner.algorithm={component}")
        gpus = self._gpus_for(stage)
        if gpus:
            out += [
                "learner.topology.device=cuda",
                f"learner.topology.nproc_per_node={len(gpus)}",
                f"learner.topology.devices={_yaml_value([str(g) for g in gpus])}",
            ]
        if "num_processes" in o:
            out.append(f"learner.topology.nproc_per_node={int(o.pop('num_processes'))}")
        from hybridflow.services.learner.config import LearnerConfig

        renamed = LearnerConfig.RENAMED_KEYS  # a stage's options may use the flat names
        return out + [f"learner.{renamed.get(k, k)}={_yaml_value(v)}" for k, v in o.items()]

    def _critic(self, stage: Stage) -> list[str]:
        """PPO's critic; with GPUs (or ``num_processes`` on CPU) on ranks of its own."""
        out = ["learner.algorithm=ppo"]
        gpus = self._gpus_for(stage)
        ranks = len(gpus) or int(stage.options.get("num_processes", 0))
        if ranks:
            out.append(f"learner.topology.critic_nproc_per_node={ranks}")
        if gpus:
            out.append(f"learner.topology.critic_devices={_yaml_value([str(g) for g in gpus])}")
        if "lr" in stage.options:
            out.append(f"learner.critic.lr={_yaml_value(stage.options['lr'])}")
        return out

    def _reference(self, stage: Stage) -> list[str]:
        out = ["learner.kl.use_reference=true"]
        if stage.num_gpus:
            self.notices.append(
                f"reference: num_gpus={stage.num_gpus}: the reference runs inside the "
                "learner's processes"
            )
        if "kl_coef" in stage.options:
            out.append(f"learner.kl.coef={_yaml_value(stage.options['kl_coef'])}")
        return out

    def _reward_components(self, stages: list[Stage]) -> list[dict[str, Any]]:
        """``reward.components``: one per reward stage (rule or reward model)."""
        components = []
        names: set[str] = set()
        for i, stage in enumerate(stages):
            o = dict(stage.options)
            component = "rule" if stage.component is None else str(stage.component)
            is_model = component.startswith("builtin:") or Path(component).is_dir()
            name = str(o.pop("name", "rm" if is_model else "rule"))
            if name in names:
                name = f"{name}{i}"
            names.add(name)
            entry: dict[str, Any] = {"name": name, "weight": float(o.pop("weight", 1.0))}
            if "data_sources" in o:
                entry["data_sources"] = list(o.pop("data_sources"))
            if is_model:
                entry.update(kind="model", model=component)
                gpus = self._gpus_for(stage)
                if gpus:
                    entry["device"] = f"cuda:{gpus[0]}"
            else:
                entry["kind"] = "rule"
                if component != "rule":
                    entry["scorer"] = component
            entry.update(o)
            components.append(entry)
        return components


def _yaml_value(value: Any) -> str:
    """A Python value as the loader reads it in ``KEY=VALUE`` (JSON is YAML)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Path):
        return str(value)
    return json.dumps(value)
