"""`adaptivespec bench`: the side-by-side benchmark (see `vllm_adaptivespec.bench`).

`add_parser(subparsers)` adds the `bench` command; the parsed namespace's ``func(args) -> int`` runs it.
Exit status: 0 all cells measured, 1 some failed or were skipped, 2 nothing could run, 130 interrupted.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from .bench.settings import PRESETS, BenchSettings
from .bench.workloads import WORKLOADS

DEFAULT_PAIR = "qwen-coder"


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "bench", help="benchmark AdaptiveSpec against autoregressive and stock vLLM speculation",
        description="Runs every configuration on the same prompts and models, one vLLM engine per "
                    "configuration in its own process, and writes results.json, results.md and plots/ "
                    "into --output (rewritten after every cell; re-running resumes).",
    )
    parser.add_argument("--mode", choices=tuple(PRESETS), default="quick",
                        help="quick: ar, static-k4, policy-only, margin-k4@0.5, adaptive@0.5 on 4 fixed short "
                             "HumanEval problems and 4 general prompts, batch 1, greedy, short answers, a "
                             "14-minute budget; tree: trees (static, policy-only, adaptive@0.5) against chains, "
                             "n-gram and static k on 8 short problems and 8 prompts, batch 1 and 8; lean: the "
                             "plugin's own cost, pinned-k2/pinned-k4 (AdaptiveSpec lossless at a fixed depth) each "
                             "right after static-k2/static-k4, plus static-tree, on 32 problems and 16 prompts "
                             "(1,500+ tokens a cell), batch 1 and 8, greedy, 2 interleaved repeats; stock: AdaptiveSpec "
                             "(policy-only, adaptive@0.5) against ar and every stock configuration (static k=1..4, "
                             "ngram, suffix where Arctic Inference is installed, dynamic) on the same cells, 2 "
                             "interleaved repeats; full: every "
                             "configuration, 5 taus, all 164 problems, 62 prompts and 240 math problems, batch 1 "
                             "and 8, temperature 0 and 0.7 (default: quick)")
    models = parser.add_argument_group("models")
    models.add_argument("--pair", default=DEFAULT_PAIR,
                        help="embedded model pair prepared by `adaptivespec models prepare` (default: qwen-coder)")
    models.add_argument("--target", help="target checkpoint directory (overrides --pair)")
    models.add_argument("--drafter", help="drafter checkpoint directory (overrides --pair)")
    what = parser.add_argument_group("what to run (defaults come from --mode)")
    what.add_argument("--configs", type=_names,
                      help="comma-separated configurations: names, <row>@<tau>, a kind (static) or all; "
                           "see --list")
    what.add_argument("--taus", type=_floats, help="tau values of the swept configurations, e.g. 0.9,0.5,0.1")
    what.add_argument("--workloads", type=_names,
                      help="comma-separated, of humaneval, general (speed only, nothing graded), math "
                           "(checked arithmetic word problems, exact-match accuracy), edit (edit a HumanEval "
                           "solution: the edited code must pass its tests and make the change), quote (quote the "
                           "sentence of a passage that answers a question: exact quote) and mixed (edit, quote, "
                           "humaneval and general items in turn) (default: humaneval,general; full: all six)")
    what.add_argument("--batches", type=_ints, help="concurrent requests, e.g. 1,8")
    what.add_argument("--temperatures", type=_floats, help="e.g. 0,0.7")
    what.add_argument("--humaneval-problems", help="comma-separated problem numbers, or 'all'")
    what.add_argument("--humaneval-format", choices=("continue", "restate"), default="continue",
                      help="continue: the answer opens with the problem's signature and docstring, the model "
                           "writes the body; restate: the model writes the whole function (default: continue)")
    what.add_argument("--general-limit", type=int, help="number of general prompts (an evenly spread subset)")
    what.add_argument("--math-limit", type=int,
                      help="number of math problems: the first N of the 240 generated (the 11 kinds take turns)")
    what.add_argument("--math-seed", type=int, default=0, help="seed of the generated math problems (default: 0)")
    what.add_argument("--edit-limit", type=int, help="number of code edits (an evenly spread subset of the 164)")
    what.add_argument("--quote-limit", type=int, help="number of quote questions (an evenly spread subset of the 24)")
    what.add_argument("--mixed-limit", type=int, help="number of mixed items (edit, quote, humaneval, general in turn)")
    for workload in WORKLOADS:
        what.add_argument(f"--max-tokens-{workload}", type=int)
    engine = parser.add_argument_group("engine")
    engine.add_argument("--max-model-len", type=int, default=2048)
    engine.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                        help="no torch.compile / CUDA graphs (default: on without a GPU, off with one)")
    engine.add_argument("--dtype", default="bfloat16")
    run = parser.add_argument_group("run")
    run.add_argument("--output", type=Path, help="result directory (default: ./adaptivespec-bench-<mode>)")
    run.add_argument("--fresh", action="store_true", help="discard results already in --output")
    run.add_argument("--repeats", type=int,
                     help="rounds of the whole configuration list, interleaved (A B C A B C), each configuration "
                          "in a fresh process; figures are medians over rounds (lean, stock: 2; other modes: 1)")
    run.add_argument("--budget-minutes", type=float,
                     help="stop starting configurations after this long; 0 = no limit (quick: 14)")
    run.add_argument("--sandbox-timeout", type=float, default=20.0,
                     help="wall-clock seconds per HumanEval test program (CPU time is capped at this + 1)")
    run.add_argument("--stall-timeout", type=float, default=300.0,
                     help="seconds without any new token after which a cell is failed as stuck (default 300)")
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    run.add_argument("--list", action="store_true", help="print the configuration table and exit")
    parser.set_defaults(func=main)
    return parser


def _list() -> int:
    from .bench.configs import TABLE

    for row in TABLE:
        name = f"{row.name}@<tau>" if row.per_tau else row.name
        print(f"{name:18s} {row.kind:13s} {row.about}")
        print(f"{'':18s} speculative_config={row.speculative} adaptivespec={row.adaptivespec}")
    return 0


def _resolve_models(args) -> tuple[str, str | None, str | None, dict]:
    """(target, drafter, why the drafter is missing, models record); SystemExit when no target."""
    if args.target:
        if not Path(args.target).is_dir():
            raise SystemExit(f"adaptivespec bench: --target {args.target} is not a directory")
        drafter, problem = args.drafter, None
        if drafter is None:
            problem = "no --drafter given with --target"
        elif not Path(drafter).is_dir():
            drafter, problem = None, f"--drafter {args.drafter} is not a directory"
        return args.target, drafter, problem, {"pair": None, "target": args.target, "drafter": drafter}
    from .models import ModelPrepareError, model_path

    try:
        target = str(model_path(args.pair, "target"))
    except ModelPrepareError as err:
        raise SystemExit(f"adaptivespec bench: {err}") from None
    drafter, problem = args.drafter, None
    if drafter is None:
        try:
            drafter = str(model_path(args.pair, "drafter"))
        except ModelPrepareError as err:
            problem = str(err)
    return target, drafter, problem, {"pair": args.pair, "target": target, "drafter": drafter}


def _has_gpu() -> bool:
    import shutil

    return shutil.which("nvidia-smi") is not None


def build_settings(args, target: str, drafter: str | None):
    preset = dict(PRESETS[args.mode])
    max_tokens = dict(preset["max_tokens"])
    for workload in WORKLOADS:
        if getattr(args, f"max_tokens_{workload}"):
            max_tokens[workload] = getattr(args, f"max_tokens_{workload}")
    problems = preset["humaneval_problems"]
    if args.humaneval_problems:
        problems = None if args.humaneval_problems.strip() == "all" else _ints(args.humaneval_problems)
    budget = preset["budget_minutes"] if args.budget_minutes is None else (args.budget_minutes or None)
    return BenchSettings(
        mode=args.mode,
        pair=args.pair,
        target=target,
        drafter=drafter,
        configs=args.configs or preset["configs"],
        taus=args.taus or preset["taus"],
        workloads=args.workloads or preset["workloads"],
        batches=args.batches or preset["batches"],
        temperatures=args.temperatures if args.temperatures is not None else preset["temperatures"],
        humaneval_problems=problems,
        humaneval_format=args.humaneval_format,
        general_limit=args.general_limit if args.general_limit is not None else preset["general_limit"],
        math_limit=args.math_limit if args.math_limit is not None else preset["math_limit"],
        math_seed=args.math_seed,
        **{f"{w}_limit": preset[f"{w}_limit"] if getattr(args, f"{w}_limit") is None else getattr(args, f"{w}_limit")
           for w in ("edit", "quote", "mixed")},
        max_tokens=max_tokens,
        max_model_len=args.max_model_len,
        enforce_eager=args.enforce_eager if args.enforce_eager is not None else not _has_gpu(),
        dtype=args.dtype,
        budget_minutes=budget,
        repeats=args.repeats if args.repeats is not None else preset.get("repeats", 1),
        sandbox_timeout_s=args.sandbox_timeout,
        stall_timeout_s=args.stall_timeout,
        output=args.output or Path(f"adaptivespec-bench-{args.mode}"),
    )


def main(args) -> int:
    if args.list:
        return _list()
    from pydantic import ValidationError

    from .bench.results import ResumeError
    from .bench.runner import Run

    target, drafter, problem, models = _resolve_models(args)
    if problem:
        print(f"adaptivespec bench: drafter unavailable, draft-model configurations will fail: {problem}",
              file=sys.stderr)
    try:
        settings = build_settings(args, target, drafter)
    except ValidationError as err:
        raise SystemExit(f"adaptivespec bench: {err}") from None
    command = shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])
    try:
        run = Run(settings, command, fresh=args.fresh, drafter_problem=problem, models=models,
                  show_progress=not args.no_progress)
    except ResumeError as err:
        raise SystemExit(f"adaptivespec bench: {err}") from None
    return run.execute()


def standalone(argv: list[str] | None = None) -> int:
    """`python benchmarks/run_bench.py ...`: the same command without the `adaptivespec` front end."""
    parser = argparse.ArgumentParser(prog="adaptivespec")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)
