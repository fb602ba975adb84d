"""The coordinator's tokenizer loads without torch and tokenizes exactly like the usual one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from transformers import AutoTokenizer

from hybridflow.models import resolve_model_path

PROBE = """
import json, sys
from hybridflow.models.text_only import load_tokenizer
tok = load_tokenizer(sys.argv[1])
chat = [{"role": "user", "content": "3+4="}]
print(json.dumps({
    "torch": "torch" in sys.modules,
    "encode": tok.encode("12+7=", add_special_tokens=False),
    "decode": tok.decode([23, 15, 24, 33, 2], skip_special_tokens=True),
    "chat": tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True),
}))
"""


def test_tokenizer_without_torch_matches_the_usual_one() -> None:
    path = resolve_model_path("builtin:tiny")
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe["torch"] is False
    assert "PyTorch was not found" not in out.stderr
    usual = AutoTokenizer.from_pretrained(str(path))
    chat = [{"role": "user", "content": "3+4="}]
    assert probe["encode"] == usual.encode("12+7=", add_special_tokens=False)
    assert probe["decode"] == usual.decode([23, 15, 24, 33, 2], skip_special_tokens=True)
    assert probe["chat"] == usual.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True
    )


def test_where_torch_is_loaded_nothing_is_hidden() -> None:
    import torch  # noqa: F401 — this process has torch

    from hybridflow.models.text_only import load_tokenizer

    tok = load_tokenizer(resolve_model_path("builtin:tiny"))
    assert tok.encode("3+4=", add_special_tokens=False) == [23, 15, 24, 33]
    assert sys.modules["torch"] is not None
