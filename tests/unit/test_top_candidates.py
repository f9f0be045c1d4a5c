"""The drafter's top candidates and confidence: max(dim) / top-k plus one logsumexp, against softmax references."""

from __future__ import annotations

import pytest
import torch

from vllm_adaptivespec.engine.proposer import top_candidates


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("width", [1, 3])
def test_top_candidates_match_argmax_topk_and_softmax(dtype, width):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(5, 1000, generator=gen) * 4).to(dtype)
    logits[2, 17] = logits[2, 400] = logits[2].max() + 1  # a tie: the first maximum, as argmax takes it
    tokens, logprobs, confidence = top_candidates(logits, width)
    reference = torch.log_softmax(logits.float(), dim=-1)
    assert tokens.shape == logprobs.shape == (5, width) and confidence.shape == (5,)
    untied = [0, 1, 3, 4]
    assert torch.equal(tokens[untied, 0], logits[untied].argmax(dim=-1))
    assert logits[2, tokens[2, 0]] == logits[2].max()
    if width == 1:  # max(dim) takes the first maximum, as argmax does (top-k gives either)
        assert tokens[2, 0] == 17
    assert torch.allclose(logprobs, reference.gather(-1, tokens), atol=1e-5)
    assert torch.allclose(confidence, reference.max(dim=-1).values.exp(), atol=1e-5)
    if width > 1:
        assert torch.equal(tokens[untied, 1:], logits[untied].float().topk(width, dim=-1).indices[:, 1:])
