"""Per-runner AdaptiveSpec state: one policy per request, the step being verified, step stats.

Lives in the worker next to vLLM's model runner. The proposer asks it for depths, the margin sampler
asks it for each request's tau and promotion allowance and reports back what was accepted; it feeds
that to the request's policy and keeps counts for the metrics.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch

from vllm_adaptivespec.config import AdaptiveSpecConfig
from vllm_adaptivespec.engine.request_params import request_tau
from vllm_adaptivespec.policy import PolicyBank


@dataclass
class StepStats:
    """What one engine step did, shipped to the scheduler with the model runner output."""

    promoted: int = 0
    depth_counts: list[int] = field(default_factory=list)  # index = chosen depth

    def add_depths(self, depths: Iterable[int]) -> None:
        for depth in depths:
            if depth >= len(self.depth_counts):
                self.depth_counts.extend([0] * (depth + 1 - len(self.depth_counts)))
            self.depth_counts[depth] += 1


@dataclass
class Verification:
    """The inputs the margin sampler needs for the batch it is verifying, in batch-row order."""

    tau: torch.Tensor  # [B] float
    allowance: torch.Tensor  # [B] long
    num_draft_tokens: list[int]
    num_accepted: list[int] | None = None
    num_promoted: list[int] | None = None


class AdaptiveState:
    def __init__(self, config: AdaptiveSpecConfig, runner: Any):
        self.config = config
        self.policies = PolicyBank(config)
        self._runner = runner
        self.step = StepStats()
        self.verification: Verification | None = None

    def request_ids(self) -> list[str]:
        return list(self._runner.input_batch.req_ids)

    def choose_depths(self, confidence: torch.Tensor, ceiling: int) -> list[int]:
        """Each batch row's draft depth this step, from its policy and its first-pass confidence."""
        req_ids = self.request_ids()
        batch = len(req_ids)
        depths = [
            min(self.policies[rid].shape(float(confidence[row]), batch_size=batch).depth, ceiling)
            for row, rid in enumerate(req_ids)
        ]
        self.step.add_depths(depths)
        return depths

    @contextmanager
    def verifying(self, num_draft_tokens: list[int]) -> Iterator[Verification]:
        """Expose the batch's verification inputs to the sampler, then feed back the outcome."""
        req_ids = self.request_ids()
        taus, allowances = [], []
        for rid in req_ids:
            request = self._runner.requests.get(rid)
            extra = getattr(getattr(request, "sampling_params", None), "extra_args", None)
            taus.append(request_tau(extra, self.config))
            allowances.append(self.policies[rid].promotion_allowance())
        self.verification = Verification(
            tau=torch.tensor(taus, dtype=torch.float32),
            allowance=torch.tensor(allowances, dtype=torch.long),
            num_draft_tokens=list(num_draft_tokens),
        )
        try:
            yield self.verification
            done = self.verification
            if done.num_accepted is not None:
                for rid, drafted, accepted, promoted in zip(
                    req_ids, done.num_draft_tokens, done.num_accepted, done.num_promoted
                ):
                    if drafted:
                        self.policies[rid].observe(drafted, accepted, promoted)
                self.step.promoted += sum(done.num_promoted)
        finally:
            self.verification = None

    def take_step_stats(self) -> StepStats:
        stats, self.step = self.step, StepStats()
        return stats

    def free(self, req_ids: Iterable[str]) -> None:
        for rid in req_ids:
            self.policies.free(rid)
