"""Hooks on vLLM's V1 model runner (worker process): drafter swap, margin verification, cleanup.

All hooks are no-ops for a runner whose config has no `adaptivespec` settings.
"""

from __future__ import annotations

from contextlib import contextmanager

from vllm.v1.sample import rejection_sampler as vllm_rejection
from vllm.v1.worker import gpu_model_runner as gmr

from vllm_adaptivespec.engine import sampler
from vllm_adaptivespec.engine.patching import replace, wrap
from vllm_adaptivespec.engine.proposer import AdaptiveDraftModelProposer, AdaptiveEagleProposer
from vllm_adaptivespec.engine.settings import settings_for
from vllm_adaptivespec.engine.state import AdaptiveState


@contextmanager
def _adaptive_proposer_classes():
    """The runner builds its drafter from these module globals; swap them only while it does."""
    saved = gmr.DraftModelProposer, gmr.EagleProposer
    gmr.DraftModelProposer, gmr.EagleProposer = AdaptiveDraftModelProposer, AdaptiveEagleProposer
    try:
        yield
    finally:
        gmr.DraftModelProposer, gmr.EagleProposer = saved


def _state(runner) -> AdaptiveState | None:
    return getattr(runner, "adaptivespec", None)


def install() -> None:
    runner_cls = gmr.GPUModelRunner

    @wrap(runner_cls, "__init__", "build AdaptiveSpec drafters and per-request state")
    def __init__(original, self, vllm_config, *args, **kwargs):
        config = settings_for(vllm_config)
        if config is None:
            return original(self, vllm_config, *args, **kwargs)
        with _adaptive_proposer_classes():
            original(self, vllm_config, *args, **kwargs)
        self.adaptivespec = AdaptiveState(config, self)
        self.drafter.adaptive_state = self.adaptivespec

    @wrap(runner_cls, "_sample", "verify drafts with the margin rule, feed back to the policies")
    def _sample(original, self, logits, spec_decode_metadata, *args, **kwargs):
        state = _state(self)
        if state is None or spec_decode_metadata is None:
            return original(self, logits, spec_decode_metadata, *args, **kwargs)
        with state.verifying(spec_decode_metadata.num_draft_tokens) as verification:
            sampler.set_active(verification)
            try:
                return original(self, logits, spec_decode_metadata, *args, **kwargs)
            finally:
                sampler.set_active(None)

    @wrap(runner_cls, "_update_states", "free the policies of finished and aborted requests")
    def _update_states(original, self, scheduler_output, *args, **kwargs):
        state = _state(self)
        if state is not None:
            state.free(scheduler_output.finished_req_ids)
        return original(self, scheduler_output, *args, **kwargs)

    @wrap(runner_cls, "sample_tokens", "ship the step's AdaptiveSpec stats to the scheduler")
    def sample_tokens(original, self, *args, **kwargs):
        output = original(self, *args, **kwargs)
        state = _state(self)
        if state is not None and isinstance(output, gmr.ModelRunnerOutput):
            output.adaptivespec = state.take_step_stats()
        return output

    replace(
        vllm_rejection,
        "rejection_sample",
        sampler.margin_rejection_sample,
        "margin-rule verification while an AdaptiveSpec runner verifies; stock otherwise",
    )
