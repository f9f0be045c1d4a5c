"""Engine-test fixtures: tiny checkpoints written once per session, and prompts for them."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    from vllm_adaptivespec.models.tiny import write_tiny_models

    return write_tiny_models(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="session")
def tiny_prompts(tiny_models):
    """Four distinct prompts of token ids inside the tiny vocabulary."""
    return [[(7 * i + 13 * j) % 200 + 20 for j in range(10 + 3 * i)] for i in range(4)]
