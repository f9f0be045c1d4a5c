"""AdaptiveSpec chain mode on the real embedded `smollm2` pair (SmolLM2-135M-Instruct + its early-exit
drafter): lossless output must equal plain greedy decoding token for token, at batch 1 and 4.

Run in float32: in bf16, verifying several tokens in one forward rounds differently from decoding them
one by one, so stock vLLM speculation itself drifts from plain decoding there (measured on this pair:
stock draft_model k=4 and AdaptiveSpec tau=1 first differ from plain at the very same positions).
"""

from __future__ import annotations

import pytest

from enginerun import run_engine

pytestmark = [pytest.mark.engine, pytest.mark.real_models]
QUESTIONS = [
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that returns the factorial of n.",
    "List three uses of a paperclip.",
    "What is 17 times 23? Show your steps.",
]


@pytest.fixture(scope="module")
def smollm2():
    from vllm_adaptivespec.models import prepare

    return prepare("smollm2")


@pytest.fixture(scope="module")
def prompts(smollm2):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2.target))
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in QUESTIONS
    ]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def _spec(pair, prompts, adaptivespec=None):
    engine = {"model": str(pair.target), "dtype": "float32"}
    if adaptivespec is not None:
        engine["speculative_config"] = {"method": "draft_model", "model": str(pair.drafter), "num_speculative_tokens": 4}
        engine["additional_config"] = {"adaptivespec": adaptivespec}
    return {"engine": engine, "prompts": prompts, "max_tokens": 96, "batch_sizes": [1, 4]}


def test_smollm2_lossless_chain_equals_plain_greedy(smollm2, prompts):
    plain = run_engine(_spec(smollm2, prompts))
    adaptive = run_engine(_spec(smollm2, prompts, adaptivespec={"tau": 1.0}))
    assert adaptive["outputs"]["1"] == plain["outputs"]["1"]
    assert adaptive["outputs"]["4"] == plain["outputs"]["4"]
    metrics = adaptive["metrics"]
    assert metrics["vllm:spec_decode_num_accepted_tokens"] > 0
    assert metrics["vllm:adaptivespec_promoted_tokens"] == 0
