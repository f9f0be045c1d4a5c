"""AdaptiveSpec chain mode on the real embedded `smollm2` pair (SmolLM2-135M-Instruct + its early-exit
drafter): lossless output must equal plain greedy decoding token for token at batch 4, with the drafter's
backlog caught up in chunks and with drafts copied from the requests' own text. Lossless chains and trees
with policy shapes at batch 1 and 4 over 256 tokens, and random off-steps, are in test_tree_real_models.py.

Run in float32: in bf16, verifying several tokens in one forward rounds differently from decoding them
one by one, so stock vLLM speculation itself drifts from plain decoding there (measured on this pair:
stock draft_model k=4 and AdaptiveSpec tau=1 first differ from plain at the very same positions).
"""

from __future__ import annotations

import pytest

from enginerun import run_engine

pytestmark = [pytest.mark.engine, pytest.mark.real_models]


def _spec(pair, prompts, adaptivespec=None, debug=None, batch_sizes=(1, 4)):
    engine = {"model": str(pair.target), "dtype": "float32"}
    if adaptivespec is not None:
        engine["speculative_config"] = {"method": "draft_model", "model": str(pair.drafter), "num_speculative_tokens": 4}
        engine["additional_config"] = {"adaptivespec": adaptivespec}
        if debug is not None:
            engine["additional_config"]["adaptivespec_debug"] = debug
    return {"engine": engine, "prompts": prompts, "max_tokens": 96, "batch_sizes": list(batch_sizes)}


def test_smollm2_drafter_catches_up_in_chunks_when_its_backlog_overflows(smollm2, smollm2_prompts):
    # 48 batched tokens: the drafter's buffers hold 48 rows, so four prompts skipped at prefill (random
    # off-steps) cannot all be caught up in one pass; the backlog goes in chunks, the requests left behind
    # draft nothing meanwhile. Output stays plain greedy, and once caught up the drafts are as good.
    pinned = {"tau": 1.0, "min_depth": 2, "max_depth": 2}
    runs = []
    for settings, debug in ((None, None), (pinned, None), (pinned, {"random_off": 3})):
        spec = _spec(smollm2, smollm2_prompts, adaptivespec=settings, debug=debug, batch_sizes=[4])
        spec["engine"]["max_num_batched_tokens"] = 48
        runs.append(run_engine(spec))
    plain, always, chunked = runs
    for run in (always, chunked):
        assert run["outputs"]["4"] == plain["outputs"]["4"]
    assert chunked["metrics"]["vllm:adaptivespec_draft_depth"]["buckets"]["0.0"] > 0
    assert _accepted_per_draft_token(chunked["metrics"]) >= 0.9 * _accepted_per_draft_token(always["metrics"])


def _accepted_per_draft_token(metrics) -> float:
    return metrics["vllm:spec_decode_num_accepted_tokens"] / metrics["vllm:spec_decode_num_draft_tokens"]


CODE = "def add(a, b):\n    result = a + b\n    return result\n\ndef mul(a, b):\n    result = a * b\n    return result\n"
ECHO_QUESTIONS = [
    f"Repeat this code exactly, then rename result to value:\n{CODE}",
    "List three uses of a paperclip.",
    f"Copy the following text:\n{CODE}{CODE}",
    "Write a Python function that returns the factorial of n.",
]


def test_smollm2_free_drafts_are_used_and_lossless(smollm2):
    # Prompts whose answers copy the prompt: the default settings draft from the requests' own text (the
    # free source) where it is likelier than the drafter, the drafter elsewhere; output stays plain greedy.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2.target))
    prompts = [
        tokenizer(
            tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False),
            add_special_tokens=False,
        )["input_ids"]
        for q in ECHO_QUESTIONS
    ]
    plain = run_engine(_spec(smollm2, prompts, batch_sizes=[4]))
    free = run_engine(_spec(smollm2, prompts, adaptivespec={"tau": 1.0}, batch_sizes=[4]))
    assert free["outputs"]["4"] == plain["outputs"]["4"]
    metrics = free["metrics"]
    assert metrics["vllm:adaptivespec_free_draft_tokens"] > 0
    assert metrics["vllm:spec_decode_num_accepted_tokens"] > 0
