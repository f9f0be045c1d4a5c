"""Start-up cost profile: the step plan's prices before the first request.

The step plan (``step_cost``) prices every step with the target's forward time by query tokens and
the drafter's pass time by rows, measured on real steps. Until two target sizes and one drafter size
are measured it has no prices, so the first steps of an engine ran on policy shapes (at batch 8 on 2
CPU cores up to 8 deep, step p99 1.76 s, where the plan later kept the drafter off) and could not
choose to skip the drafter.

So once the KV cache exists (``GPUModelRunner.initialize_kv_cache``; the model is loaded and, where
vLLM compiles it, compiled), the runner times forwards on dummy inputs, as vLLM's own profile run
does (zero token ids, no attention metadata: attention over a context is left out, so these are
a little cheap), for query sizes q = 1, 2, 4, ... and drafter rows r = 1, 2, 4, ..., target and
drafter in turn, each size once after one untimed warm-up call of each model, up to the largest
step the engine can run (``max_num_seqs`` requests verifying ``num_speculative_tokens`` each, at
most ``max_num_batched_tokens``) or until ``PROFILE_SECONDS`` are spent, whichever comes first (a
GPU covers every size in milliseconds; 2 CPU cores reach a few dozen tokens). The readings are
ordinary observations of the step-cost model: real steps join them in the same windows and outvote
them within a few steps.
"""

from __future__ import annotations

import time

import torch
from vllm.forward_context import set_forward_context

from vllm_adaptivespec.step_cost import StepCosts

PROFILE_SECONDS = 4.0  # wall-clock the profile may spend (it finishes the size it started)


def profile_sizes(max_num_seqs: int, num_speculative_tokens: int, max_num_batched_tokens: int) -> list[int]:
    """Powers of two from 1 up to the largest step, ``max_num_seqs * (1 + k)`` query tokens capped at
    ``max_num_batched_tokens``, that step itself last if it is not a power of two.

    Worked example: 8 requests, k = 8, 4096 batched tokens -> [1, 2, 4, 8, 16, 32, 64, 72]."""
    largest = max(1, min(max_num_seqs * (1 + num_speculative_tokens), max_num_batched_tokens))
    sizes = [1 << i for i in range(largest.bit_length()) if (1 << i) <= largest]
    return sizes if sizes[-1] == largest else [*sizes, largest]


def profile_step_costs(runner, costs: StepCosts, budget_s: float = PROFILE_SECONDS) -> int:
    """Time the target (``runner.model``) and the drafter (``runner.drafter.model``) on dummy inputs and
    record the readings in the step-cost model: ``costs.target.observe(q, seconds)``,
    ``costs.draft_pass.observe(r, seconds)``.
    Returns the number of sizes profiled (0: the runner has nothing this profile can time)."""
    drafter = getattr(runner, "drafter", None)
    if getattr(runner, "supports_mm_inputs", False) or getattr(drafter, "model", None) is None:
        return 0
    scheduler = runner.vllm_config.scheduler_config
    sizes = profile_sizes(
        runner.input_batch.max_num_reqs, runner.num_spec_tokens, scheduler.max_num_batched_tokens
    )
    device = runner.device
    ids = torch.zeros(sizes[-1], dtype=torch.long, device=device)  # [q] token ids
    positions = torch.arange(sizes[-1], dtype=torch.long, device=device)  # [q]

    def target(n: int) -> None:
        runner.model(input_ids=ids[:n], positions=positions[:n], intermediate_tensors=None, inputs_embeds=None)

    def draft(n: int) -> None:
        kwargs = {"input_ids": ids[:n], "positions": positions[:n], "inputs_embeds": None}
        if drafter.pass_hidden_states_to_model:  # EAGLE heads read the target's hidden states
            kwargs["hidden_states"] = drafter.hidden_states[:n]  # [r, hidden]
        drafter.model(**kwargs)

    def timed(forward, n: int) -> float:
        with set_forward_context(None, runner.vllm_config, num_tokens=n):
            _synchronize(device)
            started = time.perf_counter()
            forward(n)
            _synchronize(device)
            return time.perf_counter() - started

    began = time.perf_counter()
    with torch.inference_mode():
        for forward in (target, draft):  # first calls: kernel selection, allocations
            timed(forward, 1)
        done = 0
        for n in sizes:
            if time.perf_counter() - began > budget_s:
                break
            costs.target.observe(n, timed(target, n))
            costs.draft_pass.observe(n, timed(draft, n))
            done += 1
    return done


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
