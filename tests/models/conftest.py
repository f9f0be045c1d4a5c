"""Fixtures for the model tests: vLLM engines built in this process, one module at a time."""

from __future__ import annotations

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "real_models: prepares a real embedded model pair (downloads it once into the cache)"
    )


@pytest.fixture(scope="module")
def vllm_env():
    """In-process engines with a small KV cache: fast to start, and torn down with the LLM object."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
        yield
