"""Fixtures of the benchmark-harness tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """Tiny random Llama target + its one-layer prefix as drafter (the project's test checkpoints)."""
    from vllm_adaptivespec.models.tiny import write_tiny_models

    return write_tiny_models(tmp_path_factory.mktemp("bench-tiny"))
