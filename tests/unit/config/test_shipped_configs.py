"""Every YAML the repository ships loads strictly."""

from pathlib import Path

import pytest

from hybridflow.config.job import JobConfig, load_job_config

REPO = Path(__file__).resolve().parents[3]
SHIPPED = sorted(
    p
    for p in REPO.glob("**/*.yaml")
    if ".venv" not in p.parts and "runs" not in p.parts and "results" not in p.parts
)


def test_some_configs_are_shipped():
    assert any(p.name == "quickstart.yaml" for p in SHIPPED)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_shipped_config_loads(path):
    if "benchmarks" in path.parts:
        pytest.skip("benchmark configs have their own loader test")
    assert isinstance(load_job_config(path), JobConfig)


def test_config_modules_import_without_torch_or_grpc():
    import subprocess
    import sys

    code = (
        "import sys, hybridflow.config.job;"
        "bad = [m for m in ('torch', 'grpc', 'transformers') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
