"""Every YAML the repository ships loads strictly."""

from pathlib import Path

import pytest

from hybridflow.job_config import JobConfig, load_job_config

REPO = Path(__file__).resolve().parents[3]
SHIPPED = sorted(
    p
    for p in REPO.glob("**/*.yaml")
    if not any(part.startswith(".venv") for part in p.parts)  # .venv, .venv-cookbook
    and "runs" not in p.parts
    and "results" not in p.parts
    and not p.name.startswith(".")  # tool configs (.pre-commit-config.yaml), not jobs
    # deploy/k8s holds Kubernetes manifests (tests/unit/deploy/test_k8s_manifests.py); only its
    # job.yaml files are job configs.
    and (p.name == "job.yaml" or "k8s" not in p.relative_to(REPO).parts)
)


def test_some_configs_are_shipped():
    assert any(p.name == "quickstart.yaml" for p in SHIPPED)


def load_benchmark_config(path: Path) -> object:
    """A benchmarks/ YAML with the dataclass its runner uses; suite configs also resolve the
    job config of every variant, so a misspelled override fails here, not after a long run."""
    import yaml

    from benchmarks.common.config import BenchmarkConfig
    from benchmarks.common.seed_config import (
        Machine,
        SeedConfig,
        is_seed_layout,
        translate_seed_config,
    )
    from benchmarks.integration.config import IntegrationConfig
    from hybridflow.config.loader import load_config
    from hybridflow.loadgen.config import LoadgenConfig

    folder = path.relative_to(REPO / "benchmarks").parts[0]
    if folder == "vs_trl":  # a job config, under each variant's overrides of run_benchmark.py
        from benchmarks.vs_trl.run_benchmark import JOB, VARIANTS

        assert path == REPO / JOB
        return [load_job_config(path, overrides) for overrides in VARIANTS.values()]
    if folder == "loadgen":  # the target address is given on the command line
        return load_config(LoadgenConfig, path, ["address=127.0.0.1:50051"])
    if folder == "integration":
        return load_config(IntegrationConfig, path)
    if is_seed_layout(yaml.safe_load(path.read_text())):  # the seed guide's layout, translated
        seed = load_config(SeedConfig, path)
        cfg = translate_seed_config(seed, Machine(num_cpus=2)).config
    else:
        cfg = load_config(BenchmarkConfig, path)
    assert cfg.suite == folder, f"{path}: suite {cfg.suite!r} in folder {folder!r}"
    for variant in cfg.variants:
        load_job_config(REPO / cfg.job, [*cfg.overrides, *variant.overrides])
    return cfg


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_shipped_config_loads(path):
    if "benchmarks" in path.parts:
        assert load_benchmark_config(path) is not None
        return
    assert isinstance(load_job_config(path), JobConfig)


def test_every_benchmark_suite_ships_a_config():
    for suite in ("throughput", "scalability", "algorithm", "integration"):
        assert REPO / "benchmarks" / suite / "config.yaml" in SHIPPED


def test_config_modules_import_without_torch_or_grpc():
    import subprocess
    import sys

    code = (
        "import sys, hybridflow.job_config;"
        "bad = [m for m in ('torch', 'grpc', 'transformers') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_an_old_key_set_over_a_shipped_config_that_uses_the_new_one_overrides_it():
    # The quickstart names learner.topology.nproc_per_node; a user's muscle memory the old
    # learner.nproc_per_node. Both the load and the launcher's preflight take it.
    from hybridflow.deploy.preflight import config_problems

    quickstart = REPO / "deploy/configs/quickstart.yaml"
    assert "nproc_per_node" in quickstart.read_text()
    job = load_job_config(quickstart, ["learner.nproc_per_node=2"])
    assert job.learner.topology.nproc_per_node == 2
    assert config_problems(quickstart, ["learner.nproc_per_node=2"]) == []
    assert config_problems(quickstart, ["learner.nproc_per_node=0"]) != []  # still bounded
