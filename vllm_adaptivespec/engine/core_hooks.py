"""Hook on vLLM's scheduler (engine-core process): carry worker step stats into SpecDecodingStats."""

from __future__ import annotations

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.spec_decode.metrics import SpecDecodingStats

from vllm_adaptivespec.engine.metrics import add_step_stats
from vllm_adaptivespec.engine.patching import VllmPatch


class SchedulerPatch(VllmPatch[Scheduler]):
    def update_from_output(self, scheduler_output, model_runner_output, *args, **kwargs):
        """copy AdaptiveSpec step stats into the step's stats"""
        outputs = SchedulerPatch.stock.update_from_output(self, scheduler_output, model_runner_output, *args, **kwargs)
        step = getattr(model_runner_output, "adaptivespec", None)
        if step is None:
            return outputs
        for engine_core_outputs in outputs.values():
            stats = engine_core_outputs.scheduler_stats
            if stats is None:
                continue
            if stats.spec_decoding_stats is None:  # a step that verified no draft still chose depths (0s too)
                stats.spec_decoding_stats = SpecDecodingStats.new(self.num_spec_tokens)
            add_step_stats(stats.spec_decoding_stats, step)
        return outputs
