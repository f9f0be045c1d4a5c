"""The batched core gives the same answers on every available device (CUDA when present)."""

from __future__ import annotations

import pytest
import torch

from vllm_adaptivespec.margin import verify_greedy, verify_sampled
from vllm_adaptivespec.policy import TreeShape
from vllm_adaptivespec.tree import TreeBuilder

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SHAPES = [TreeShape(4, 3, 10), TreeShape(3, 1, 3), TreeShape(0, 1, 0), TreeShape(5, 2, 9)]
VOCAB = 50


def run(device: str):
    gen = torch.Generator().manual_seed(0)
    builder = TreeBuilder(SHAPES, device=device)
    while not builder.done:
        ids, _ = builder.frontier()
        logits = torch.randn(*ids.shape, VOCAB, generator=gen)
        logprobs, tokens = logits.log_softmax(-1).topk(3, dim=-1)
        builder.add_level(tokens.to(device), logprobs.to(device))
    trees = builder.finish()
    target = torch.randn(len(SHAPES), trees.num_slots + 1, VOCAB, generator=gen) * 2
    target[:, :, 7] += 3  # a common top-1 so paths get accepted
    target = target.to(device)
    uniforms = torch.rand(len(SHAPES), trees.num_slots, generator=gen).to(device)
    tau = torch.tensor([1.0, 0.5, 0.3, 0.9], device=device)
    allowance = torch.tensor([0, 2, 1, 3], device=device)
    greedy = verify_greedy(target, trees, tau, allowance)
    sampled = verify_sampled(target.softmax(-1), trees, tau, allowance, uniforms=uniforms)
    return trees, greedy, sampled


@pytest.mark.parametrize("device", DEVICES)
def test_results_match_cpu(device):
    cpu_trees, cpu_greedy, cpu_sampled = run("cpu")
    trees, greedy, sampled = run(device)
    for name in ("tokens", "parents", "depths", "num_nodes", "builder_ids"):
        assert torch.equal(getattr(trees, name).cpu(), getattr(cpu_trees, name)), name
    assert torch.allclose(trees.cum_logprobs.cpu(), cpu_trees.cum_logprobs)
    assert torch.equal(trees.ancestor_mask().cpu(), cpu_trees.ancestor_mask())
    assert torch.equal(greedy.output_tokens().cpu(), cpu_greedy.output_tokens())
    assert torch.equal(greedy.num_promoted.cpu(), cpu_greedy.num_promoted)
    assert torch.equal(sampled.accepted_nodes.cpu(), cpu_sampled.accepted_nodes)
    assert torch.equal(sampled.num_promoted.cpu(), cpu_sampled.num_promoted)
    assert greedy.next_token.device.type == torch.device(device).type
