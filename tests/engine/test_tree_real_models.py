"""AdaptiveSpec chain and tree mode on the real embedded `smollm2` pair (SmolLM2-135M-Instruct + its
early-exit drafter): lossless drafts must equal plain greedy decoding token for token over 256 tokens,
with policy-chosen shapes at batch 1 and 4, and at batch 4 with shapes drawn at random every step, about
every other step without any drafter pass (the drafter catches up later; chains of random depth go through
vLLM's own drafting loop and rejection sampler, trees through ours; random shapes at batch 1 are covered on
the tiny models by test_tree_engine.py). float32, as in test_real_models.py (in bf16 even stock speculation
drifts from plain decoding). Sized for CI: at 512 tokens and both batch sizes everywhere this module took
29 minutes on a 2-core AVX2 machine.
"""

from __future__ import annotations

import pytest

from enginerun import run_engine

pytestmark = [pytest.mark.engine, pytest.mark.real_models]
LONG = 256


def _spec(pair, prompts, adaptivespec=None, debug=None, batch_sizes=(1, 4)):
    engine = {"model": str(pair.target), "dtype": "float32"}
    if adaptivespec is not None:
        engine["speculative_config"] = {"method": "draft_model", "model": str(pair.drafter), "num_speculative_tokens": 12}
        engine["additional_config"] = {"adaptivespec": adaptivespec}
        if debug is not None:
            engine["additional_config"]["adaptivespec_debug"] = debug
    return {"engine": engine, "prompts": prompts, "max_tokens": LONG, "batch_sizes": list(batch_sizes)}


@pytest.fixture(scope="module")
def plain(smollm2, smollm2_prompts):
    return run_engine(_spec(smollm2, smollm2_prompts), timeout=1800)


@pytest.mark.parametrize(
    "settings",
    [{"mode": "tree", "max_width": 3}, {"mode": "chain", "max_depth": 8}],
    ids=["tree", "chain"],
)
@pytest.mark.parametrize(
    "debug", [None, {"random_shapes": 3, "random_off": 5}], ids=["policy-shapes", "random-shapes-and-off-steps"]
)
def test_smollm2_lossless_drafts_equal_plain_greedy(smollm2, smollm2_prompts, plain, settings, debug):
    # Drafting every step: on some machines the step plan rightly finds this drafter never pays and would
    # verify nothing (speculation off is covered by the random off-steps and tests/engine/test_step_plan.py).
    settings = {**settings, "allow_off": False}
    batches = (1, 4) if debug is None else (4,)
    tree = run_engine(_spec(smollm2, smollm2_prompts, {"tau": 1.0, **settings}, debug, batches), timeout=1800)
    assert sorted(tree["outputs"]) == sorted(str(b) for b in batches)
    for batch in tree["outputs"]:
        for i, (want, got) in enumerate(zip(plain["outputs"][batch], tree["outputs"][batch])):
            first = next((j for j, (a, b) in enumerate(zip(want, got)) if a != b), None)
            assert got == want, f"batch {batch}, prompt {i}: first difference at token {first}"
    assert all(len(t) == LONG for t in tree["outputs"]["4"])
    metrics = tree["metrics"]
    assert metrics["vllm:spec_decode_num_accepted_tokens"] > 0
    if settings["mode"] == "tree":  # trees verify more nodes than their depth
        assert metrics["vllm:spec_decode_num_draft_tokens"] > metrics["vllm:adaptivespec_draft_depth"]["sum"]
    else:  # a chain's nodes are its depth (the scheduler may still cut a draft near the length limit)
        assert metrics["vllm:spec_decode_num_draft_tokens"] <= metrics["vllm:adaptivespec_draft_depth"]["sum"]
