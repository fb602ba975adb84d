"""The vLLM replica's side of LoRA: adapters served per policy version, or merged.

``weight_sync.lora: adapter``: the engine runs with vLLM's LoRA layers (``engine_args``).
Each sync's adapter is written as a PEFT directory named after its vLLM id (atomically:
vLLM reads it only once it is whole) and every request from then on carries a
``LoRARequest`` with a new id (one per sync, counting from 1: a re-sync of the same version,
say from a restarted learner, gets a new id too), so vLLM loads it into its adapter cache on
first use: vLLM keys its cache by id and skips loading an id it holds, so a reused id would
keep serving the old adapter. Requests in flight keep the adapter they started with: their
tokens carry that version. The last ``KEEP_ADAPTERS`` directories stay (vLLM may reload an
evicted adapter still in use).

``merged``: no LoRA layers; the workers merge the adapter into a copy of the base weights
and reload them (``vllm_worker.WeightSyncWorker.hf_merge_adapters``).

Knows vLLM's LoRA request, not its workers.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from hybridflow.lora.config import LoraConfig
from hybridflow.lora.export import peft_config_dict, write_peft_dir
from hybridflow.lora.names import TableRow, adapter_table

VLLM_MAX_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts."""
KEEP_ADAPTERS = 3


def engine_args(config: LoraConfig) -> dict[str, Any]:
    """vLLM's LoRA settings for adapters of ``config.rank``: two adapters resident (the
    current one and the one requests in flight may still use), a few more in CPU memory."""
    fitting = [r for r in VLLM_MAX_RANKS if r >= config.rank]
    if not fitting:
        raise ValueError(f"learner.lora.rank {config.rank} exceeds vLLM's largest, 512")
    return {"enable_lora": True, "max_lora_rank": fitting[0], "max_loras": 2, "max_cpu_loras": 4}


class VLLMAdapters:
    """The adapter table of the served model and, in adapter mode, the adapter directories
    and the ``LoRARequest`` of the version served now."""

    def __init__(
        self, config: LoraConfig, mode: str, base_table: Sequence[TableRow], model_path: str
    ) -> None:
        if mode not in ("adapter", "merged"):
            raise ValueError(f"weight_sync.lora must be adapter or merged, got {mode!r}")
        self.config = config
        self.mode = mode
        self.table: list[TableRow] = adapter_table(base_table, config.target_modules, config.rank)
        self._model_path = model_path
        shm = Path("/dev/shm")
        self._root = Path(
            tempfile.mkdtemp(prefix="hybridflow-lora-", dir=shm if shm.is_dir() else None)
        )
        self._written: list[Path] = []
        self.request: Any = None
        """The ``LoRARequest`` new requests carry; None before the first sync (a fresh
        adapter is the base model: B is zero)."""
        self.new_id = itertools.count(1).__next__
        """Gives each sync's adapter its vLLM id (tests replace it to simulate a reuse)."""

    def next_sync(self) -> tuple[int, Path]:
        """The vLLM id of the next sync's adapter and the directory it is written to."""
        adapter_id = self.new_id()
        return adapter_id, self._root / f"id{adapter_id}"

    def config_dict(self) -> dict[str, object]:
        return peft_config_dict(self.config, self._model_path)

    def write(self, path: Path, named: Sequence[tuple[str, torch.Tensor]]) -> None:
        """An adapter as a PEFT directory (tensors received in this process)."""
        write_peft_dir(path, named, self.config, self._model_path)

    def serve(self, version: int, adapter_id: int, path: Path) -> None:
        """New requests use the adapter written to ``path`` under ``adapter_id``; the
        directories of all but the last ``KEEP_ADAPTERS`` syncs go."""
        from vllm.lora.request import LoRARequest

        if not (path / "adapter_model.safetensors").is_file():
            raise RuntimeError(f"adapter of v{version} was not written to {path}")
        self.request = LoRARequest(f"policy-v{version}-id{adapter_id}", adapter_id, str(path))
        self._written.append(path)  # each sync has its own id, so its own directory
        while len(self._written) > KEEP_ADAPTERS:
            shutil.rmtree(self._written.pop(0), ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)
