"""AdaptiveSpec tree mode inside a real vLLM 0.32 engine (tiny random models, CPU).

Lossless (tau = 1) greedy output must equal plain greedy decoding token for token, at batch 1 and 4,
over 512 tokens (a wrong KV move or position shows up late), with policy-chosen shapes and with
shapes drawn at random every step (trees and chains; a draft model also skipping its pass at random, so
on/off transitions and off-streaks are crossed), free branches (copies) in the trees; sampled output must
follow the target's distribution.
"""

from __future__ import annotations

import pytest
import torch

from enginerun import run_engine

pytestmark = pytest.mark.engine
LONG = 512
TREE = {"tau": 1.0, "mode": "tree", "max_width": 3}


def _spec(models, prompts, *, method="draft_model", adaptivespec=None, k=12, debug=None, max_tokens=LONG, **extra):
    engine = {"model": str(models.target)}
    if adaptivespec is not None:
        drafter = models.draft if method == "draft_model" else models.eagle3
        engine["speculative_config"] = {"method": method, "model": str(drafter), "num_speculative_tokens": k}
        engine["additional_config"] = {"adaptivespec": adaptivespec}
        if debug is not None:
            engine["additional_config"]["adaptivespec_debug"] = debug
    return {"engine": engine, "prompts": prompts, "max_tokens": max_tokens, "batch_sizes": [1, 4], **extra}


@pytest.fixture(scope="module")
def plain_long(tiny_models, tiny_prompts):
    return run_engine(_spec(tiny_models, tiny_prompts), timeout=900)


def _assert_identical(result, plain):
    for batch in ("1", "4"):
        for i, (want, got) in enumerate(zip(plain["outputs"][batch], result["outputs"][batch])):
            first = next((j for j, (a, b) in enumerate(zip(want, got)) if a != b), None)
            assert got == want, f"batch {batch}, prompt {i}: first difference at token {first}"
    assert all(len(t) == LONG for t in result["outputs"]["4"])


def _depth_sum(metrics) -> float:
    return metrics["vllm:adaptivespec_draft_depth"]["sum"]


def test_policy_trees_equal_plain_greedy_over_512_tokens(tiny_models, tiny_prompts, plain_long):
    # The tiny drafter costs what the tiny target does, so the step plan would take the copies alone and
    # keep the drafter off; allow_off false keeps drafter trees (with copy branches) in every step.
    result = run_engine(_spec(tiny_models, tiny_prompts, adaptivespec={**TREE, "allow_off": False}), timeout=900)
    _assert_identical(result, plain_long)
    metrics = result["metrics"]
    assert metrics["vllm:spec_decode_num_accepted_tokens"] > 0
    assert metrics["vllm:adaptivespec_promoted_tokens"] == 0
    # Wider than chains: more nodes were verified than the trees were deep.
    assert metrics["vllm:spec_decode_num_draft_tokens"] > _depth_sum(metrics)
    # Free branches (copies of the requests' own text, on by default) were in the trees.
    assert metrics["vllm:adaptivespec_free_draft_tokens"] > 0


@pytest.mark.parametrize(
    "method, mode", [("draft_model", "tree"), ("eagle3", "tree"), ("draft_model", "chain")], ids=["draft_model",
                                                                                                 "eagle3", "chain"]
)  # fmt: skip
def test_random_tree_shapes_every_step_equal_plain_greedy(tiny_models, tiny_prompts, plain_long, method, mode):
    """Shapes drawn at random per request and step: every layout, KV move and batch mix gets exercised. A draft
    model also skips its pass on about every other step at random (prefills included: random off-streaks, the
    drafter catching up at its next pass); an EAGLE head cannot skip (it needs the target's hidden states)."""
    debug = {"random_shapes": 7, **({"random_off": 11} if method == "draft_model" else {})}
    settings = {**TREE, "max_width": 4} if mode == "tree" else {"tau": 1.0, "max_depth": 8}
    result = run_engine(
        _spec(tiny_models, tiny_prompts, method=method, adaptivespec=settings, debug=debug), timeout=900
    )  # fmt: skip
    _assert_identical(result, plain_long)
    metrics = result["metrics"]
    if method == "draft_model":  # steps without any drafter pass: depth 0 for every request
        assert metrics["vllm:adaptivespec_draft_depth"]["buckets"]["0.0"] > 0
    if mode == "chain":  # a chain's nodes are its depth (the scheduler may still cut a draft near the length limit)
        assert metrics["vllm:spec_decode_num_draft_tokens"] <= _depth_sum(metrics)
        assert metrics["vllm:spec_decode_num_accepted_tokens"] > 0
        return
    assert metrics["vllm:spec_decode_num_draft_tokens"] > 1.5 * _depth_sum(metrics)
    assert metrics["vllm:spec_decode_num_accepted_tokens"] > 0
    assert metrics["vllm:adaptivespec_free_draft_tokens"] > 0  # copies beside random drafter trees


def test_margin_rule_over_trees_obeys_the_ratio_test(tiny_models, tiny_prompts):
    """tau < 1: promotions happen, and every emitted token is the target's top-1 or within the margin
    (checked up to each sequence's first off-argmax token, where the context changes)."""
    tau = 0.3
    result = run_engine(
        _spec(tiny_models, tiny_prompts, adaptivespec={**TREE, "tau": tau, "max_promotions_per_step": 4,
                                                        "max_promotions_per_window": 64,
                                                        "promotion_min_acceptance": 0.0}, max_tokens=48)
    )  # fmt: skip
    assert result["metrics"]["vllm:adaptivespec_promoted_tokens"] > 0
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_models.target), torch_dtype=torch.float32).eval()
    off_argmax = 0
    for prompt, generated in zip(tiny_prompts, result["outputs"]["4"]):
        with torch.no_grad():
            probs = model(torch.tensor([prompt + generated])).logits[0, len(prompt) - 1 : -1].softmax(-1)
        ratio = probs.gather(1, torch.tensor(generated)[:, None])[:, 0] / probs.max(-1).values
        first = next((i for i, r in enumerate(ratio.tolist()) if r < 1 - 1e-4), None)
        if first is not None:
            off_argmax += 1
            assert ratio[first] >= tau - 1e-3
    assert off_argmax > 0


def test_sampled_trees_follow_the_target_distribution(tiny_models, tiny_prompts):
    """temperature > 0 over trees (recursive rejection sampling) must sample the target's distribution:
    each generated token's randomized probability integral transform, with the vocabulary ordered from
    most to least likely, is Uniform(0, 1) (a sampler that leans to likely tokens, e.g. greedy
    acceptance, piles up near 0). Temperature 0.3 so that drafts do get accepted."""
    copies, new_tokens, temperature = 240, 6, 0.3
    prompt = tiny_prompts[1]
    result = run_engine(
        # allow_off false: the test is of the sampler over trees, whatever the step plan would price them at
        {**_spec(tiny_models, [prompt] * copies, adaptivespec={**TREE, "max_width": 4, "allow_off": False},
                 max_tokens=new_tokens),
         "batch_sizes": [copies], "temperature": temperature}
    )  # fmt: skip
    assert result["metrics"]["vllm:spec_decode_num_accepted_tokens"] > 100
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_models.target), torch_dtype=torch.float32).eval()
    sequences = torch.tensor([prompt + out for out in result["outputs"][str(copies)]])
    with torch.no_grad():  # rows for the 2nd..last generated token (the 1st is sampled without drafts)
        probs = (model(sequences).logits[:, len(prompt) : -1].double() / temperature).softmax(-1)
    tokens = sequences[:, len(prompt) + 1 :, None]
    ordered, order = probs.sort(dim=-1, descending=True)
    rank = order.argsort(dim=-1).gather(2, tokens)
    p_token = probs.gather(2, tokens)[..., 0]
    below = ordered.cumsum(-1).gather(2, rank)[..., 0] - p_token
    noise = torch.rand(below.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    uniforms = (below + noise * p_token).flatten()
    assert _ks_statistic(uniforms) < 1.95 / uniforms.numel() ** 0.5  # KS test at 0.1%


def _ks_statistic(samples: torch.Tensor) -> float:
    """Kolmogorov-Smirnov distance between the samples' empirical CDF and Uniform(0, 1)."""
    ordered, n = samples.sort().values, samples.numel()
    rank = torch.arange(1, n + 1, dtype=torch.float64)
    return float(torch.maximum(rank / n - ordered, ordered - (rank - 1) / n).max())
