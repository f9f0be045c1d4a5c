"""Hooks on vLLM's V1 model runner (worker process): drafter swap, tree scheduling, margin
verification, KV compaction, cleanup.

All hooks are no-ops for a runner whose config has no `adaptivespec` settings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.sample import rejection_sampler as vllm_rejection
from vllm.v1.worker import gpu_model_runner as gmr

from vllm_adaptivespec.engine import sampler
from vllm_adaptivespec.engine.patching import ScopedSwap, register_attention_backend, replace, wrap
from vllm_adaptivespec.engine.proposer import AdaptiveDraftModelProposer, AdaptiveEagleProposer
from vllm_adaptivespec.engine.settings import debug_settings, settings_for
from vllm_adaptivespec.engine.state import AdaptiveState
from vllm_adaptivespec.engine.tree_step import TreeStep


@dataclass
class StepOutputs:
    """What the target forward produced that the accepted-path reordering must touch."""

    hidden: list[torch.Tensor]  # hidden states (and EAGLE-3 auxiliary ones), one row per query token
    slot_mappings: object  # per attention layer: the KV slot each query row was written to


def _state(runner) -> AdaptiveState | None:
    return getattr(runner, "adaptivespec", None)


def install() -> None:
    runner_cls = gmr.GPUModelRunner
    # The runner builds its drafter from these module globals: ours only while an AdaptiveSpec runner does.
    proposer_swaps = [
        ScopedSwap(gmr, "DraftModelProposer", AdaptiveDraftModelProposer, "AdaptiveSpec draft-model drafter"),
        ScopedSwap(gmr, "EagleProposer", AdaptiveEagleProposer, "AdaptiveSpec EAGLE drafter"),
    ]

    @wrap(runner_cls, "__init__", "build AdaptiveSpec drafters and per-request state")
    def __init__(original, self, vllm_config, *args, **kwargs):
        config = settings_for(vllm_config)
        if config is None:
            return original(self, vllm_config, *args, **kwargs)
        with proposer_swaps[0].applied(), proposer_swaps[1].applied():
            original(self, vllm_config, *args, **kwargs)
        debug = debug_settings(vllm_config)
        self.adaptivespec = AdaptiveState(
            config, self, debug.get("random_shapes"), debug.get("random_off"), debug.get("record_steps", 0)
        )
        self.drafter.adaptive_state = self.adaptivespec

    @wrap(runner_cls, "_prepare_inputs", "lay out draft trees: depth positions, ancestor-mask attention plan")
    def _prepare_inputs(original, self, scheduler_output, *args, **kwargs):
        state = _state(self)
        if state is not None:
            state.begin_step()
            state.forward_started = time.perf_counter()
        result = original(self, scheduler_output, *args, **kwargs)
        if state is not None:
            state.tree_step = None
            if state.config.mode == "tree" and scheduler_output.scheduled_spec_decode_tokens:
                started = time.perf_counter()
                state.tree_step = TreeStep(self, state, scheduler_output)
                state.tree_step.begin(self)
                state.charge(started)
        return result

    @wrap(runner_cls, "_sample", "verify drafts with the margin rule, feed back to the policies")
    def _sample(original, self, logits, spec_decode_metadata, *args, **kwargs):
        state = _state(self)
        if state is None or spec_decode_metadata is None:
            if state is not None:
                state.record_plain_step(self.input_batch.num_reqs)
            return original(self, logits, spec_decode_metadata, *args, **kwargs)
        step, state.tree_step = state.tree_step, None
        trees = step.trees if step is not None else None
        with state.verifying(spec_decode_metadata.num_draft_tokens, trees) as verification:
            sampler.set_active(verification)
            try:
                output = original(self, logits, spec_decode_metadata, *args, **kwargs)
            finally:
                sampler.set_active(None)
            if step is not None:
                started = time.perf_counter()
                step.finish(self, verification.accepted_nodes, state.step_outputs)
                state.charge(started)
            return output

    @wrap(runner_cls, "_update_states", "free the policies of finished and aborted requests")
    def _update_states(original, self, scheduler_output, *args, **kwargs):
        state = _state(self)
        if state is not None:
            state.free(scheduler_output.finished_req_ids)
        return original(self, scheduler_output, *args, **kwargs)

    @wrap(runner_cls, "sample_tokens", "keep the forward's hidden states for tree reordering; ship step stats")
    def sample_tokens(original, self, *args, **kwargs):
        state = _state(self)
        executed = self.execute_model_state
        if state is not None and executed is not None:
            if state.forward_started is not None:
                if executed.hidden_states.is_cuda:
                    torch.cuda.synchronize()
                elapsed = time.perf_counter() - state.forward_started
                state.observe_target(executed.scheduler_output.total_num_scheduled_tokens, elapsed)
                state.forward_started = None
            state.step_outputs = StepOutputs(
                [executed.hidden_states, *(executed.aux_hidden_states or [])], executed.slot_mappings
            )
        output = original(self, *args, **kwargs)
        if state is not None and isinstance(output, gmr.ModelRunnerOutput):
            output.adaptivespec = state.take_step_stats()
        return output

    register_attention_backend(
        AttentionBackendEnum.CPU_ATTN,
        "vllm_adaptivespec.engine.tree_attention.TreeCPUAttentionBackend",
        "ancestor-mask attention for draft-tree rows (stock kernel for every other row)",
    )
    register_attention_backend(
        AttentionBackendEnum.FLASH_ATTN,
        "vllm_adaptivespec.engine.tree_attention_cuda.TreeFlashAttentionBackend",
        "ancestor-mask attention for draft-tree rows (stock kernel for every other row)",
    )
    replace(
        vllm_rejection,
        "rejection_sample",
        sampler.margin_rejection_sample,
        "margin-rule verification while an AdaptiveSpec runner verifies; stock otherwise",
    )
