"""Hooks on vLLM's V1 model runner (worker process): drafter and rejection-sampler swap, tree
scheduling, margin verification, KV compaction, cleanup.

All hooks are no-ops for a runner whose config has no `adaptivespec` settings. What a step needs
travels on objects the runner holds: its `AdaptiveState` (``runner.adaptivespec``, also held by the
drafter and the rejection sampler), the step's `TreeStep` on it, whose attention plan goes to the
target forward on that forward's attention metadata.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from vllm.logger import init_logger
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.worker import gpu_model_runner as gmr

from vllm_adaptivespec.engine.cost_profile import profile_step_costs
from vllm_adaptivespec.engine.patching import BackendOverride, ScopedSwap, VllmPatch
from vllm_adaptivespec.engine.proposer import AdaptiveDraftModelProposer, AdaptiveEagleProposer
from vllm_adaptivespec.engine.sampler import MarginRejectionSampler
from vllm_adaptivespec.engine.settings import debug_settings, settings_for
from vllm_adaptivespec.engine.state import AdaptiveState
from vllm_adaptivespec.engine.tree_attention import attach_verification_plan
from vllm_adaptivespec.engine.tree_step import TreeStep

logger = init_logger("vllm.adaptivespec")


@dataclass
class StepOutputs:
    """What the target forward produced that the accepted-path reordering must touch."""

    hidden: list[torch.Tensor]  # hidden states (and EAGLE-3 auxiliary ones), one row per query token
    slot_mappings: object  # per attention layer: the KV slot each query row was written to


def _state(runner) -> AdaptiveState | None:
    return getattr(runner, "adaptivespec", None)


# The runner builds its drafter and rejection sampler from these module globals: ours only while an
# AdaptiveSpec runner does.
RUNNER_CLASS_SWAPS = (
    ScopedSwap(gmr, "DraftModelProposer", "AdaptiveSpec draft-model drafter", AdaptiveDraftModelProposer),
    ScopedSwap(gmr, "EagleProposer", "AdaptiveSpec EAGLE drafter", AdaptiveEagleProposer),
    ScopedSwap(gmr, "RejectionSampler", "AdaptiveSpec margin verification", MarginRejectionSampler),
)

# vLLM's attention backends that AdaptiveSpec's tree attention extends (by class path: the CUDA one
# imports flash-attn).
TREE_ATTENTION_BACKENDS = tuple(
    BackendOverride(
        backend,
        f"vllm_adaptivespec.engine.{path}",
        "ancestor-mask attention for draft-tree branch rows (stock kernel, once, for every other row)",
    )
    for backend, path in (
        (AttentionBackendEnum.CPU_ATTN, "tree_attention.TreeCPUAttentionBackend"),
        (AttentionBackendEnum.FLASH_ATTN, "tree_attention_cuda.TreeFlashAttentionBackend"),
    )
)


class GPUModelRunnerPatch(VllmPatch[gmr.GPUModelRunner]):
    def __init__(self, vllm_config, *args, **kwargs):
        """build AdaptiveSpec drafters, rejection sampler and per-request state"""
        config = settings_for(vllm_config)
        if config is None:
            return GPUModelRunnerPatch.stock.__init__(self, vllm_config, *args, **kwargs)
        with ExitStack() as swaps:
            for swap in RUNNER_CLASS_SWAPS:
                swaps.enter_context(swap.applied())
            GPUModelRunnerPatch.stock.__init__(self, vllm_config, *args, **kwargs)
        debug = debug_settings(vllm_config)
        self.adaptivespec = AdaptiveState(
            config, self, debug.get("random_shapes"), debug.get("random_off"), debug.get("record_steps", 0)
        )
        self.drafter.adaptive_state = self.adaptivespec
        self.rejection_sampler.adaptive_state = self.adaptivespec

    def initialize_kv_cache(self, kv_cache_config, is_profiling=False, *args, **kwargs):
        """time target and drafter forwards on dummy inputs: the step plan's prices before the first step"""
        GPUModelRunnerPatch.stock.initialize_kv_cache(self, kv_cache_config, is_profiling, *args, **kwargs)
        state = _state(self)
        if state is not None and state.planned and not is_profiling:
            started = time.perf_counter()
            sizes = profile_step_costs(self, state.step_costs)
            logger.info("AdaptiveSpec: step costs profiled at %d sizes in %.1f s", sizes, time.perf_counter() - started)

    def _prepare_inputs(self, scheduler_output, *args, **kwargs):
        """lay out draft trees: depth positions, ancestor-mask attention plan"""
        state = _state(self)
        if state is not None:
            state.begin_step()
            state.forward_started = time.perf_counter()
        result = GPUModelRunnerPatch.stock._prepare_inputs(self, scheduler_output, *args, **kwargs)
        if state is not None:
            state.tree_step = None
            if state.config.mode == "tree" and scheduler_output.scheduled_spec_decode_tokens:
                started = time.perf_counter()
                state.tree_step = TreeStep.of(self, state, scheduler_output)  # None: only chains
                if state.tree_step is not None:
                    state.tree_step.begin(self)
                state.charge(started)
        return result

    def _build_attention_metadata(self, *args, **kwargs):
        """hand the step's draft-tree attention plan to the target forward on its attention metadata"""
        attn_metadata, spec_decode_common = GPUModelRunnerPatch.stock._build_attention_metadata(self, *args, **kwargs)
        state = _state(self)
        step = state.tree_step if state is not None else None
        if step is not None:
            attach_verification_plan(attn_metadata, step.plan)
        return attn_metadata, spec_decode_common

    def _sample(self, logits, spec_decode_metadata, *args, **kwargs):
        """verify drafts with the margin rule, feed back to the policies"""
        state = _state(self)
        if state is None or spec_decode_metadata is None:
            if state is not None:
                state.record_plain_step(self.input_batch.num_reqs)
            return GPUModelRunnerPatch.stock._sample(self, logits, spec_decode_metadata, *args, **kwargs)
        step, state.tree_step = state.tree_step, None
        trees = step.trees if step is not None else None
        # The runner's MarginRejectionSampler reads the batch's Verification off the state it holds.
        with state.verifying(spec_decode_metadata.num_draft_tokens, trees) as verification:
            output = GPUModelRunnerPatch.stock._sample(self, logits, spec_decode_metadata, *args, **kwargs)
            if step is not None:
                started = time.perf_counter()
                step.finish(self, verification.accepted_paths(), state.step_outputs)
                state.charge(started)
            return output

    def _update_states(self, scheduler_output, *args, **kwargs):
        """free the policies of finished and aborted requests"""
        state = _state(self)
        if state is not None:
            state.free(scheduler_output.finished_req_ids)
        return GPUModelRunnerPatch.stock._update_states(self, scheduler_output, *args, **kwargs)

    def sample_tokens(self, *args, **kwargs):
        """keep the forward's hidden states for tree reordering; ship step stats"""
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
        output = GPUModelRunnerPatch.stock.sample_tokens(self, *args, **kwargs)
        if state is not None and isinstance(output, gmr.ModelRunnerOutput):
            output.adaptivespec = state.take_step_stats()
        return output
