"""CLI: --help is instant (no grpc/torch import), flags map onto config keys, bad input is 2."""

import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.loadgen.cli import build_parser, flag_overrides, main

REPO = Path(__file__).resolve().parents[3]


def test_help_imports_nothing_heavy():
    code = (
        "import sys\n"
        "from hybridflow.loadgen.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "heavy = [m for m in ('grpc', 'torch', 'numpy', 'transformers', 'matplotlib', 'yaml')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert "--sweep-rates" in out.stdout and "--concurrency" in out.stdout


def test_flags_become_overrides():
    args = build_parser().parse_args(
        "--target rollout --address 127.0.0.1:9 --rate 2.5 --duration 3 --prompt-len 8:32 "
        "--batch-size 4 --n 2 --sweep-concurrency 1,2".split()
    )
    assert flag_overrides(args) == [
        'target="rollout"',
        'address="127.0.0.1:9"',
        "rate=2.5",
        "duration_s=3.0",
        "rollout.n=2",
        "rollout.prompts_per_request=4",
        "rollout.prompt_len_min=8",
        "rollout.prompt_len_max=32",
        "sweep_concurrency=[1, 2]",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--target", "reward", "--address", "0.0.0.0:5", "--rate", "1", "--duration", "1"],
         "address"),
        (["--target", "reward", "--address", "", "--rate", "1", "--duration", "1"], "address"),
        (["--target", "reward", "--address", "127.0.0.1:5", "--rate", "1"], "duration_s"),
        (["--target", "reward", "--address", "127.0.0.1:5", "--duration", "1"], "exactly one"),
        (["--address", "127.0.0.1:5", "--sweep-concurrency", "1.5", "--duration", "1"],
         "sweep_concurrency"),
    ],
)  # fmt: skip
def test_bad_arguments_exit_2_naming_the_field(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err
