"""Drafter subclasses: capture top-1 confidence and let each request's policy size its draft.

vLLM's EAGLE / draft-model proposers draft a fixed-length chain for the whole batch. After the first
drafter pass we know each request's top-1 confidence, ask its policy for this step's depth, and run
only as many further passes as the deepest request needs (drafter passes are the main cost); each
request's row is then cut to its own depth, so draft lengths differ per request and per step.
"""

from __future__ import annotations

import torch
from vllm.v1.spec_decode.draft_model import DraftModelProposer
from vllm.v1.spec_decode.eagle import EagleProposer

from vllm_adaptivespec.engine.state import AdaptiveState


class AdaptiveProposerMixin:
    """Mixed into a vLLM proposer; `adaptive_state` is attached by the runner hook."""

    adaptive_state: AdaptiveState

    def propose(self, num_speculative_tokens, *args, **kwargs):
        self._adaptive_confidence: list[torch.Tensor] = []
        self._adaptive_depths: list[int] | None = None
        try:
            drafts = super().propose(num_speculative_tokens, *args, **kwargs)
        finally:
            self.num_speculative_tokens = num_speculative_tokens  # we shortened it mid-propose
        if drafts.shape[1] == 0:
            return drafts
        depths = self._adaptive_depths
        if depths is None:  # a single pass was requested: every request drafts one token
            depths = self.adaptive_state.choose_depths(self._first_confidence(drafts), 1)
        rows = drafts.tolist()
        return [row[:depth] for row, depth in zip(rows, depths)]

    def _first_confidence(self, drafts: torch.Tensor) -> torch.Tensor:
        if self._adaptive_confidence:
            return self._adaptive_confidence[0]
        return torch.ones(drafts.shape[0])

    def _sample_draft_tokens(self, hidden_states, sampling_metadata):
        greedy = not self._enable_probabilistic_draft_probs or sampling_metadata.all_greedy
        if greedy and not (self.use_local_argmax_reduction or self.use_heterogeneous_vocab):
            logits = self.model.compute_logits(hidden_states)
            top = logits.max(dim=-1)
            confidence = torch.exp(top.values.float() - torch.logsumexp(logits.float(), dim=-1))
            token_ids, probs = top.indices, None
        else:
            token_ids, probs = super()._sample_draft_tokens(hidden_states, sampling_metadata)
            confidence = (
                probs.max(dim=-1).values.float() if probs is not None else torch.ones(len(token_ids))
            )
        self._adaptive_confidence.append(confidence.cpu())
        if len(self._adaptive_confidence) == 1 and self.num_speculative_tokens > 1:
            # First pass done: the per-request depths fix how many more passes the batch needs.
            self._adaptive_depths = self.adaptive_state.choose_depths(
                self._adaptive_confidence[0], self.num_speculative_tokens
            )
            self.num_speculative_tokens = max(self._adaptive_depths)
        return token_ids, probs


class AdaptiveDraftModelProposer(AdaptiveProposerMixin, DraftModelProposer):
    pass


class AdaptiveEagleProposer(AdaptiveProposerMixin, EagleProposer):
    pass
