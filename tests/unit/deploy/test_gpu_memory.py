"""GPU memory sampling: nvidia-smi's CSV parsed per pid, peaks kept; absent tool = no-op."""

import os
import stat

from hybridflow.deploy.gpu_memory import GpuMemorySampler, parse_compute_apps


def test_parse_sums_a_pid_over_gpus_and_skips_junk():
    text = "123, 1024\n456, 10\n123, 512\n[Not Supported], 5\n\n"
    assert parse_compute_apps(text) == {123: 1536 << 20, 456: 10 << 20}


def test_sampler_keeps_the_peak(tmp_path, monkeypatch):
    # A stand-in nvidia-smi that reports what a file says (the real one needs a GPU).
    reading = tmp_path / "reading"
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\ncat {reading}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    sampler = GpuMemorySampler()
    assert sampler.available
    for mib in (100, 300, 200):
        reading.write_text(f"42, {mib}\n")
        sampler.sample()
    assert sampler.peak_bytes == {42: 300 << 20}


def test_without_nvidia_smi_nothing_happens(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    sampler = GpuMemorySampler()
    assert not sampler.available
    sampler.start()
    sampler.sample()
    sampler.stop()
    assert sampler.peak_bytes == {}
