"""Hook on vLLM's scheduler (engine-core process): carry worker step stats into SpecDecodingStats."""

from __future__ import annotations

from vllm.v1.core.sched.scheduler import Scheduler

from vllm_adaptivespec.engine.metrics import add_step_stats
from vllm_adaptivespec.engine.patching import wrap


def install() -> None:
    @wrap(Scheduler, "update_from_output", "copy AdaptiveSpec step stats into the step's stats")
    def update_from_output(original, self, scheduler_output, model_runner_output, *args, **kwargs):
        outputs = original(self, scheduler_output, model_runner_output, *args, **kwargs)
        step = getattr(model_runner_output, "adaptivespec", None)
        if step is None:
            return outputs
        for engine_core_outputs in outputs.values():
            stats = engine_core_outputs.scheduler_stats
            if stats is not None and stats.spec_decoding_stats is not None:
                add_step_stats(stats.spec_decoding_stats, step)
        return outputs
