"""Margin verification in place of vLLM's strict rejection sampling.

An AdaptiveSpec runner is built with `MarginRejectionSampler` as its ``rejection_sampler`` (a subclass
of vLLM's `RejectionSampler`, which still computes the bonus tokens and applies logits processors,
penalties, temperature and top-k/top-p); only the accept/reject decision is `margin.py`'s, and only
while the runner verifies (stock behaviour otherwise, e.g. in vLLM's warm-up runs).

Terms, per request (the ones of vLLM's `rejection_sampler.py` plus ours):
* node: one draft token of a request's draft tree, as vLLM schedules it (flattened in node order,
  parents before children); a chain is the tree whose node i has parent i - 1. The root is the
  request's last committed token; it is not a node.
* level (depth): a node's distance from the root (children of the root: level 1); the drafter adds
  one level per pass.
* accepted: a node the target agrees with, every node on its root path accepted as well: under
  greedy sampling its token is the target's argmax after its parent, under random sampling it passes
  speculative rejection sampling (`margin.verify_sampled`). The accepted nodes of a request are one
  root path, at most one node per level.
* promoted: an accepted node strict verification would have rejected, accepted by the margin rule
  ``p(token) / p(top1) >= tau`` (tau < 1) within the request's promotion allowance for this step.
* bonus: the target's token after the last node of a fully accepted path (vLLM samples it from the
  bonus logits, beside the draft rows); when a node is rejected, its place in the output holds the
  target's own token instead (vLLM's "recovered" token).
* output tokens: the accepted nodes' tokens, then that one next token, placeholder-padded to
  ``max_spec_len + 1`` per request (vLLM's layout).

Three paths, cheapest first:
* chains that cannot promote (every request at tau 1 or out of allowance): vLLM's own
  `rejection_sample`, untouched; the accepted counts are read off its output;
* chains that may promote: `margin.verify_greedy_chains` / `verify_sampled_chains` on vLLM's ragged layout
  (no padded copy of the target's rows, no softmax over them);
* trees: the padded `[B, N+1, V]` verifiers of `margin.py`.
"""

from __future__ import annotations

import time
from functools import partial

import torch
from vllm.v1.sample import rejection_sampler as vllm_rejection

from vllm_adaptivespec.engine import cpu_fixes
from vllm_adaptivespec.engine.patching import ScopedSwap
from vllm_adaptivespec.engine.state import AdaptiveState, Verification
from vllm_adaptivespec.margin import (
    ChainResult,
    verify_greedy,
    verify_greedy_chains,
    verify_sampled,
    verify_sampled_chains,
)
from vllm_adaptivespec.tree import DraftTrees

_GREEDY_TEMPERATURE = getattr(vllm_rejection.GREEDY_TEMPERATURE, "value", vllm_rejection.GREEDY_TEMPERATURE)
_PLACEHOLDER = getattr(vllm_rejection.PLACEHOLDER_TOKEN_ID, "value", vllm_rejection.PLACEHOLDER_TOKEN_ID)

_stock_rejection_sample = vllm_rejection.rejection_sample

# vLLM's `RejectionSampler.forward` calls the module function `rejection_sample` by its global name and
# offers no method to override in between (logits processing before it, logprobs after it). Rather than
# copy that forward, ours swaps the name for the length of its own call, to a partial that carries the
# step's Verification explicitly: the swap holds no state, and stock code paths never see it.
REJECTION_SAMPLE = ScopedSwap(
    vllm_rejection, "rejection_sample", "margin-rule verification inside MarginRejectionSampler.forward"
)


class MarginRejectionSampler(vllm_rejection.RejectionSampler):
    """vLLM's rejection sampler, deciding acceptance by the margin rule while its runner verifies.

    Built by vLLM's runner constructor in place of `RejectionSampler` (the runner hook's scoped swap);
    the hook then attaches the runner's `AdaptiveState`, whose ``verification`` is set for the length
    of each verifying `_sample` call."""

    adaptive_state: AdaptiveState

    def forward(
        self,
        metadata,  # vLLM's SpecDecodeMetadata: draft tokens [num_tokens], num_draft_tokens [B], ...
        # [num_tokens, vocab_size] or None (one-hot drafts)
        draft_probs: torch.Tensor | None,
        # [num_tokens + batch_size, vocab_size]: the target's logits at every draft and bonus position
        logits: torch.Tensor,
        sampling_metadata,
    ):
        verification = self.adaptive_state.verification
        if verification is None:
            return super().forward(metadata, draft_probs, logits, sampling_metadata)
        with REJECTION_SAMPLE.applied(partial(margin_rejection_sample, verification)), cpu_fixes.while_verifying():
            return super().forward(metadata, draft_probs, logits, sampling_metadata)

    def _get_logprobs_tensors(
        self,
        max_num_logprobs: int,
        metadata,
        # [num_tokens + batch_size, vocab_size]
        logits: torch.Tensor,
        # [num_tokens, vocab_size]: the rows of the draft positions, [num_tokens + batch_size]: the bonus rows
        target_logits: torch.Tensor,
        bonus_logits: torch.Tensor,
        # [batch_size, max_spec_len + 1] output tokens, placeholder-padded
        sampled_token_ids: torch.Tensor,
    ):
        """Logprobs of the emitted tokens. vLLM reads output token j of a request off the request's logits
        row j, which is the row that predicted it only for a chain. In a tree, output token j (j >= 1) was
        predicted after the accepted node of level j, whose row is that node's index + 1 (row 0: after the
        request's last token): the rows are gathered along each request's accepted path instead."""
        verification = self.adaptive_state.verification
        nodes = None if verification is None or verification.trees is None else verification.accepted_nodes
        if nodes is None:
            return super()._get_logprobs_tensors(
                max_num_logprobs, metadata, logits, target_logits, bonus_logits, sampled_token_ids
            )
        final_logits = torch.zeros_like(logits, dtype=torch.float32)
        final_logits[metadata.target_logits_indices] = target_logits.to(torch.float32)
        final_logits[metadata.bonus_logits_indices] = bonus_logits.to(torch.float32)
        batch, width = sampled_token_ids.shape
        starts = torch.zeros_like(metadata.cu_num_sampled_tokens)
        starts[1:] = metadata.cu_num_sampled_tokens[:-1]
        rows = torch.arange(width, device=starts.device).repeat(batch, 1)  # placeholders: any row, filtered later
        path = nodes.to(starts.device)[:, : width - 1]
        rows[:, 1 : path.shape[1] + 1] = torch.where(path >= 0, path + 1, rows[:, 1 : path.shape[1] + 1])
        indices = (starts[:, None].long() + rows).flatten().clamp_(max=final_logits.shape[0] - 1)
        tokens = sampled_token_ids.flatten().to(torch.int64)
        tokens[tokens == _PLACEHOLDER] = 0
        picked = final_logits[indices]
        logprobs = picked if self.is_logits_logprobs_mode else self.sampler.compute_logprobs(picked)
        return self.sampler.gather_logprobs(logprobs, max_num_logprobs, tokens)


def margin_rejection_sample(
    verification: Verification,
    # [num_tokens]: every request's drafts, concatenated
    draft_token_ids: torch.Tensor,
    # [batch_size]: drafts per request
    num_draft_tokens: list[int],
    max_spec_len: int,
    # [batch_size]: cumulative sum of num_draft_tokens
    cu_num_draft_tokens: torch.Tensor,
    # [num_tokens, vocab_size] or None (one-hot drafts)
    draft_probs: torch.Tensor | None,
    # [num_tokens, vocab_size] float32, processed (temperature, top-k/p) for sampled requests
    target_logits: torch.Tensor,
    # [batch_size, 1]
    bonus_token_ids: torch.Tensor,
    sampling_metadata,
    *args,
    **kwargs,
) -> torch.Tensor:
    """vLLM's `rejection_sample` with the margin rule for ``verification``'s batch (the arguments after
    it are vLLM's); returns [batch_size, max_spec_len + 1] int32 output tokens, placeholder-padded."""
    if verification.trees is None and not verification.may_promote():
        output = _stock_rejection_sample(
            draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
            target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs,
        )  # fmt: skip
        # Strict chains: read the accepted counts off vLLM's output.
        started = time.perf_counter()
        num_accepted = ((output != _PLACEHOLDER).sum(1) - 1).clamp(min=0)  # accepted drafts + one next token
        verification.num_accepted = num_accepted.tolist()
        verification.num_promoted = [0] * len(num_draft_tokens)
        verification.overhead_seconds += time.perf_counter() - started
        return output
    started = time.perf_counter()
    if verification.trees is None:
        result = _margin_chains(
            verification, draft_token_ids, num_draft_tokens, max_spec_len, draft_probs, target_logits,
            bonus_token_ids, sampling_metadata,
        )  # fmt: skip
        verification.num_accepted = result.num_accepted.tolist()
        verification.num_promoted = result.num_promoted.tolist()
        verification.overhead_seconds += time.perf_counter() - started
        return result.output_tokens
    output = _padded_rejection_sample(
        verification, draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
        target_logits, bonus_token_ids, sampling_metadata,
    )  # fmt: skip
    verification.overhead_seconds += time.perf_counter() - started
    return output


def _margin_chains(
    verification: Verification,
    # [num_tokens]: every request's drafts, concatenated
    draft_token_ids: torch.Tensor,
    # [batch_size]: drafts per request
    num_draft_tokens: list[int],
    max_spec_len: int,
    # [num_tokens, vocab_size] or None (one-hot drafts)
    draft_probs: torch.Tensor | None,
    # [num_tokens, vocab_size] float32, processed for sampled requests
    target_logits: torch.Tensor,
    # [batch_size, 1]
    bonus_token_ids: torch.Tensor,
    sampling_metadata,
) -> ChainResult:
    """Chains that may promote, on vLLM's ragged layout: greedy requests by `verify_greedy_chains`, sampled
    ones by `verify_sampled_chains` (a batch of both runs both and takes each request's own)."""
    counts = torch.tensor(num_draft_tokens)
    tau, allowance = verification.tau, verification.allowance
    greedy = sampled = None
    if not sampling_metadata.all_random:
        greedy = verify_greedy_chains(draft_token_ids, target_logits, counts, bonus_token_ids, max_spec_len,
                                      tau, allowance, placeholder=_PLACEHOLDER)  # fmt: skip
    if not sampling_metadata.all_greedy:
        sampled = verify_sampled_chains(
            draft_token_ids, target_logits, counts, bonus_token_ids, max_spec_len, tau, allowance,
            placeholder=_PLACEHOLDER, draft_probs=draft_probs, generators=sampling_metadata.generators,
        )  # fmt: skip
    if sampled is None or greedy is None:
        return greedy or sampled
    is_greedy = (sampling_metadata.temperature == _GREEDY_TEMPERATURE).to(target_logits.device)  # [B]
    return ChainResult(
        torch.where(is_greedy[:, None], greedy.output_tokens, sampled.output_tokens),
        torch.where(is_greedy, greedy.num_accepted, sampled.num_accepted),
        torch.where(is_greedy, greedy.num_promoted, sampled.num_promoted),
    )


def _padded_rejection_sample(
    verification: Verification,
    # [num_tokens]: every request's drafts, concatenated
    draft_token_ids: torch.Tensor,
    # [batch_size]: drafts per request
    num_draft_tokens: list[int],
    max_spec_len: int,
    # [batch_size]: cumulative sum of num_draft_tokens
    cu_num_draft_tokens: torch.Tensor,
    # [num_tokens, vocab_size] or None (one-hot drafts)
    draft_probs: torch.Tensor | None,
    # [num_tokens, vocab_size] float32, processed for sampled requests
    target_logits: torch.Tensor,
    # [batch_size, 1]
    bonus_token_ids: torch.Tensor,
    sampling_metadata,
) -> torch.Tensor:
    """Trees: the target rows padded to ``[B, max_spec_len + 1, V]`` for
    `margin.verify_greedy` / `verify_sampled`; also records each request's accepted path."""
    device = target_logits.device
    batch, vocab = len(num_draft_tokens), target_logits.shape[-1]
    counts = torch.tensor(num_draft_tokens, dtype=torch.long, device=device)
    slots = torch.arange(max_spec_len, device=device)
    valid = slots[None, :] < counts[:, None]  # [B, K]
    flat = (cu_num_draft_tokens.long() - counts)[:, None] + slots[None, :]
    flat = flat.clamp(0, max(draft_token_ids.shape[0] - 1, 0))[valid]

    tokens = torch.full((batch, max_spec_len), -1, dtype=torch.long, device=device)
    tokens[valid] = draft_token_ids[flat].long()
    # Row j holds the target's distribution after node j-1 (row 0: after the context); the row after
    # the last node is the bonus token vLLM already sampled, as a one-hot distribution.
    logits = torch.zeros((batch, max_spec_len + 1, vocab), dtype=torch.float32, device=device)
    logits[:, :max_spec_len][valid] = target_logits[flat].float()
    rows = torch.arange(batch, device=device)
    logits[rows, counts] = float("-inf")
    logits[rows, counts, bonus_token_ids.view(-1).long()] = 0.0
    trees = _trees(verification, tokens, counts)

    if sampling_metadata.all_greedy:
        is_greedy = torch.ones(batch, dtype=torch.bool, device=device)
    elif sampling_metadata.all_random:
        is_greedy = torch.zeros(batch, dtype=torch.bool, device=device)
    else:
        is_greedy = sampling_metadata.temperature == _GREEDY_TEMPERATURE

    tau = verification.tau.to(device)
    allowance = verification.allowance.to(device)
    result = verify_greedy(logits, trees, tau, allowance)
    out_tokens, num_accepted, num_promoted = result.output_tokens(), result.num_accepted, result.num_promoted
    accepted_nodes = result.accepted_nodes
    if not bool(is_greedy.all()):
        padded_draft_probs = None
        if draft_probs is not None:
            padded_draft_probs = torch.zeros((batch, max_spec_len, vocab), dtype=torch.float32, device=device)
            padded_draft_probs[valid] = draft_probs[flat].float()
        sampled = verify_sampled(
            logits.softmax(dim=-1), trees, tau, allowance, draft_probs=padded_draft_probs,
            generators=sampling_metadata.generators,  # seeded requests draw from their own generators
        )
        out_tokens = torch.where(is_greedy[:, None], out_tokens, sampled.output_tokens())
        num_accepted = torch.where(is_greedy, num_accepted, sampled.num_accepted)
        num_promoted = torch.where(is_greedy, num_promoted, sampled.num_promoted)
        accepted_nodes = torch.where(is_greedy[:, None], accepted_nodes, sampled.accepted_nodes)

    output = torch.full((batch, max_spec_len + 1), _PLACEHOLDER, dtype=torch.int32, device=device)
    width = min(out_tokens.shape[1], max_spec_len + 1)
    output[:, :width] = out_tokens[:, :width].to(torch.int32)
    verification.num_accepted = num_accepted.tolist()
    verification.num_promoted = num_promoted.tolist()
    verification.accepted_nodes = accepted_nodes
    return output


def _trees(
    verification: Verification,
    # [batch_size, max_spec_len] long: each request's drafts in node order, -1 padded
    tokens: torch.Tensor,
    # [batch_size] long: drafts per request
    counts: torch.Tensor,
) -> DraftTrees:
    """The scheduled drafts as trees: the runner's tree layout when it has one, else chains.

    The target's rows already follow the core's convention (row 0: after the root, row i+1: after
    node i), because vLLM lays out the flattened drafts in node order."""
    given = verification.trees
    if given is None:
        return DraftTrees.chain(tokens, counts)
    given = given.to(tokens.device)
    if given.num_slots != tokens.shape[1] or not torch.equal(given.num_nodes, counts):
        raise RuntimeError("AdaptiveSpec: scheduled drafts do not match the recorded trees")
    tokens = torch.where(given.node_mask, tokens, 0)  # the core's padding token
    return DraftTrees(tokens, given.parents, given.depths, given.cum_logprobs, counts, max_depth=given.max_depth)
