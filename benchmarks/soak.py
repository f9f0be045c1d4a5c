"""Memory and state soak: many short requests and many aborted ones through one AdaptiveSpec engine.

    python benchmarks/soak.py [--requests 2000] [--aborted 500] [--output results.json]
                              [--config adaptivespec|stock|plain]

One in-process vLLM engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the worker's `AdaptiveState` is
reachable from here) on the tiny test models, speculation always on (``allow_off`` false), tau 0.5 with
per-request overrides. It runs ``--requests`` requests one after another (greedy and seeded sampling,
lossless, tau 0.3 and the server's tau, 1-8 tokens each) and ``--aborted`` requests aborted in groups of
four at different points (still queued, after the prefill step, mid-decode with drafts in flight), the two
kinds interleaved. Every ``--every`` requests it records what the plugin holds per request (the
`AdaptiveState` dicts and its `PolicyBank`), its bounded histories (pooled acceptance window, cost-model
buckets, calibration bins, step log), vLLM's own per-request tables next to them, the number of
AdaptiveSpec/spec-decode Prometheus samples (label sets), live Python objects and the process RSS.

``--config stock`` (vLLM's own draft-model speculation, k=4) and ``plain`` (no speculation) run the same
requests without the plugin, as a baseline for the RSS and object figures (their plugin fields are null).

Prints one JSON line ``SOAK_RESULT {...}`` (and writes it to ``--output`` when given);
tests/engine/test_soak.py runs it and bounds the figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path


def rss_mib() -> float:
    """Resident set size of this process now (not the peak), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def plugin_state(llm):
    """The worker's AdaptiveState (None without AdaptiveSpec), its model runner and the engine core (one
    process: uni executor)."""
    core = llm.llm_engine.engine_core.engine_core
    runner = core.model_executor.driver_worker.worker.model_runner
    return getattr(runner, "adaptivespec", None), runner, core


def metric_label_sets(llm) -> int:
    """Prometheus samples of the spec-decode and AdaptiveSpec families (grows with any per-request label)."""
    import prometheus_client

    count = 0
    for family in prometheus_client.REGISTRY.collect():
        if "spec_decode" in family.name or "adaptivespec" in family.name:
            count += len(family.samples)
    return count


def snapshot(llm, done: int, aborted: int, started: float) -> dict:
    state, runner, core = plugin_state(llm)
    gc.collect()
    point = {
        "requests": done,
        "aborted": aborted,
        "seconds": round(time.monotonic() - started, 2),
        "vllm_per_request": {
            "runner_requests": len(runner.requests),
            "scheduler_requests": len(core.scheduler.requests),
            "output_states": len(llm.llm_engine.output_processor.request_states),
        },
        "metric_samples": metric_label_sets(llm),
        "gc_objects": len(gc.get_objects()),  # tracked since vLLM's gc.freeze() at start-up
        "rss_mib": round(rss_mib(), 1),
        "per_request": None,
        "histories": None,
    }
    if state is None:
        return point
    return {
        **point,
        "per_request": {
            "policies": len(state.policies),
            "drafts": len(state.drafts),
            "confidence": len(state.confidence),
            "drafter_next": len(state.drafter_next),
            "behind": len(state.behind),
            "idle": len(state.idle),
            **(
                {}
                if state.free_drafts is None
                else {
                    "free_first": len(state.free_drafts.first),
                    "free_continued": len(state.free_drafts.continued),
                    "free_offers": len(state.free_drafts.offers),
                    "free_judging": len(state.free_drafts.judging),
                }
            ),
        },
        "histories": {
            "pooled_window": len(state.pooled),
            "free_pooled_window": 0 if state.free_drafts is None else max(
                len(state.free_drafts.pooled_first), len(state.free_drafts.pooled_continued)
            ),
            "target_cost_buckets": state.step_costs.target.points(),
            "draft_pass_buckets": state.step_costs.draft_pass.points(),
            "calibration_bins": int(state.calibration.judged.size),
            "calibration_judged": int(state.calibration.judged.sum()),
            "step_log": len(state.step_log) if state.step_log is not None else 0,
        },
    }


def build_llm(models, max_num_seqs: int, config: str = "adaptivespec"):
    from vllm import LLM

    engine = {}
    if config != "plain":
        engine["speculative_config"] = {"method": "draft_model", "model": str(models.draft), "num_speculative_tokens": 4}
    if config == "adaptivespec":
        # Always drafting: on the tiny pair the step plan would rightly keep speculation off.
        engine["additional_config"] = {"adaptivespec": {"tau": 0.5, "allow_off": False}}
    return LLM(
        model=str(models.target), enforce_eager=True, dtype="float32", seed=0, max_model_len=512,
        max_num_seqs=max_num_seqs, disable_log_stats=False, **engine,
    )  # fmt: skip


def request_params(rng: random.Random, max_tokens: int):
    """A request's sampling parameters: greedy or seeded sampling, with the server's tau, tau 0.3 or lossless."""
    from vllm import SamplingParams

    extra = rng.choice([None, {"adaptivespec_tau": 0.3}, {"adaptivespec_lossless": 1}])
    sampled = rng.random() < 0.3
    return SamplingParams(
        max_tokens=max_tokens, ignore_eos=True, temperature=0.8 if sampled else 0.0,
        seed=rng.randrange(1 << 30) if sampled else None, extra_args=extra,
    )  # fmt: skip


def prompt(rng: random.Random) -> dict:
    return {"prompt_token_ids": [rng.randrange(20, 220) for _ in range(rng.randint(4, 24))]}


def aborted_group(llm, rng: random.Random, tag: str, group: int) -> None:
    """``group`` requests added at once; each aborted after 0 to 3 engine steps (0: still queued), then the
    engine steps until none is left (the aborts reach the worker with the next scheduled step)."""
    engine = llm.llm_engine
    ids = [f"{tag}-{i}" for i in range(group)]
    when = [rng.randint(0, 3) for _ in ids]
    for rid in ids:
        engine.add_request(rid, prompt(rng), request_params(rng, 64))
    for step in range(4):
        due = [rid for rid, w in zip(ids, when) if w == step]
        if due:
            engine.abort_request(due)
        if engine.has_unfinished_requests():
            engine.step()
    while engine.has_unfinished_requests():
        engine.step()


def soak(requests: int, aborted: int, every: int, max_num_seqs: int = 4, seed: int = 0,
         config: str = "adaptivespec") -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm_adaptivespec.models.tiny import write_tiny_models

    with tempfile.TemporaryDirectory(prefix="soak-models-") as tmp:
        models = write_tiny_models(Path(tmp))
        llm = build_llm(models, max_num_seqs, config)
        rng = random.Random(seed)
        started = time.monotonic()
        points = [snapshot(llm, 0, 0, started)]
        done = cut = 0
        # Aborted groups spread evenly among the sequential requests.
        groups = -(-aborted // max_num_seqs)
        abort_at = {round((g + 1) * requests / (groups + 1)) for g in range(groups)} if groups else set()
        while done < requests or cut < aborted:
            if done in abort_at and cut < aborted:
                abort_at.discard(done)
                size = min(max_num_seqs, aborted - cut)
                aborted_group(llm, rng, f"abort-{cut}", size)
                cut += size
                continue
            if done >= requests:  # leftover aborts (rounding)
                size = min(max_num_seqs, aborted - cut)
                aborted_group(llm, rng, f"abort-{cut}", size)
                cut += size
                continue
            params = request_params(rng, rng.randint(1, 8))
            (out,) = llm.generate([prompt(rng)], params, use_tqdm=False)
            assert out.finished and len(out.outputs[0].token_ids) == params.max_tokens, out
            done += 1
            if done % every == 0:
                points.append(snapshot(llm, done, cut, started))
        points.append(snapshot(llm, done, cut, started))
        metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics()
                   if m.name.startswith(("vllm:spec_decode_num", "vllm:adaptivespec_promoted"))}  # fmt: skip
    return {"config": config, "requests": done, "aborted": cut, "every": every, "points": points, "metrics": metrics,
            "wall_seconds": round(time.monotonic() - started, 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--aborted", type=int, default=500)
    parser.add_argument("--every", type=int, default=250, help="requests between snapshots")
    parser.add_argument("--config", choices=("adaptivespec", "stock", "plain"), default="adaptivespec")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    result = soak(args.requests, args.aborted, args.every, config=args.config)
    line = json.dumps(result)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1) + "\n")
    print("SOAK_RESULT " + line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
