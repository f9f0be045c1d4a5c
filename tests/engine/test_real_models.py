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


def _spec(pair, prompts, adaptivespec=None):
    engine = {"model": str(pair.target), "dtype": "float32"}
    if adaptivespec is not None:
        engine["speculative_config"] = {"method": "draft_model", "model": str(pair.drafter), "num_speculative_tokens": 4}
        engine["additional_config"] = {"adaptivespec": adaptivespec}
    return {"engine": engine, "prompts": prompts, "max_tokens": 96, "batch_sizes": [1, 4]}


def test_smollm2_lossless_chain_equals_plain_greedy(smollm2, smollm2_prompts):
    plain = run_engine(_spec(smollm2, smollm2_prompts))
    adaptive = run_engine(_spec(smollm2, smollm2_prompts, adaptivespec={"tau": 1.0}))
    assert adaptive["outputs"]["1"] == plain["outputs"]["1"]
    assert adaptive["outputs"]["4"] == plain["outputs"]["4"]
    metrics = adaptive["metrics"]
    assert metrics["vllm:spec_decode_num_accepted_tokens"] > 0
    assert metrics["vllm:adaptivespec_promoted_tokens"] == 0
