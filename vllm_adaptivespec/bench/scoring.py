"""Accuracy of generated answers: HumanEval pass@1 (code run in the sandbox), checked math (exact match),
code edits (the edited code passes the problem's tests and makes the asked change), verbatim quotes (the
answer contains the expected sentence) and the mixed workload (each item by its own part's measure)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

from . import copying
from .math_problems import extract_answer
from .sandbox import Limits, Outcome, run_program

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|$)", re.S)


def humaneval_program(problem: dict, completion: str) -> str:
    """The script that tests one answer: the function (as completed) + the problem's tests.

    The answer usually continues the prompt's signature (the harness opens the code block with it);
    when the model instead restates the function inside a new code block, that block is used.
    """
    head, fence, rest = completion.partition("```")
    code = head
    if fence and not head.strip():  # closed the given block at once and wrote a new one
        match = _FENCE.search(rest)
        code = match.group(1) if match else ""
    if f"def {problem['entry_point']}(" in code:
        header = "\n".join(
            line for line in problem["prompt"].splitlines() if line.startswith(("import ", "from "))
        )
        body = header + "\n\n" + code
    else:
        body = problem["prompt"] + code
    return f"{body}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def score_humaneval(problems: list[dict], completions: list[str], limits: Limits = Limits(),
                    workers: int = 2) -> list[Outcome]:
    """Run each answer's tests; ``workers`` programs at a time."""
    programs = [humaneval_program(p, c) for p, c in zip(problems, completions, strict=True)]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda source: run_program(source, limits), programs))


def score_math(expected: dict[str, int], outputs: list[dict]) -> dict:
    """Checked math: the share of replies whose integer (`extract_answer`) equals the expected one,
    and for each other reply what it gave. ``expected`` maps item ids to answers; ``outputs`` holds
    ``id`` and ``text`` per reply (each gets ``extracted`` and ``correct``)."""
    failures = {}
    for output in outputs:
        output["extracted"] = extract_answer(output["text"])
        output["correct"] = output["extracted"] == expected[output["id"]]
        if not output["correct"]:
            failures[output["id"]] = f"expected {expected[output['id']]}, got {output['extracted']}"
    correct = len(outputs) - len(failures)
    return {"metric": "exact_match", "value": correct / len(outputs) if outputs else None,
            "correct": correct, "n": len(outputs), "failures": failures}


def score_edit(references: list[dict], completions: list[str], limits: Limits = Limits(),
               workers: int = 2) -> list[Outcome]:
    """Each edit: its code (the answer up to the closing fence) must make the asked change
    (`copying.edit_problem`) and pass the problem's HumanEval tests in the sandbox (run only when it does)."""
    codes = [copying.edit_code(c) for c in completions]
    problems = [copying.edit_problem(r["kind"], r["entry_point"], code, r["detail"])
                for r, code in zip(references, codes, strict=True)]
    to_run = [i for i, problem in enumerate(problems) if problem is None]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        ran = dict(zip(to_run, pool.map(
            lambda i: run_program(copying.edit_test_program(codes[i], references[i]), limits), to_run)))
    return [ran[i] if i in ran else Outcome(False, "edit not made", problems[i]) for i in range(len(codes))]


def _share(metric: str, outputs: list[dict], failures: dict) -> dict:
    correct = len(outputs) - len(failures)
    return {"metric": metric, "value": correct / len(outputs) if outputs else None,
            "correct": correct, "n": len(outputs), "failures": failures}


def pass_share(metric: str, outputs: list[dict], results: list) -> dict:
    """Share of outputs whose sandboxed run passed (``results`` in the same order); each output gets
    ``passed``, each failure its status and detail."""
    failures = {}
    for output, result in zip(outputs, results):
        output["passed"] = result.passed
        if not result.passed:
            failures[output["id"]] = result.status + (f": {result.detail}" if result.detail else "")
    return _share(metric, outputs, failures)


def score_edits(references: dict[str, dict], outputs: list[dict], limits: Limits = Limits()) -> dict:
    """The edit workload: share of answers that pass (`score_edit`); each output gets ``passed``."""
    results = score_edit([references[o["id"]] for o in outputs], [o["text"] for o in outputs], limits)
    return pass_share("edit_correct", outputs, results)


def score_quotes(sentences: dict[str, str], outputs: list[dict]) -> dict:
    """The quote workload: share of answers containing their expected sentence (`copying.quote_correct`)."""
    failures = {}
    for output in outputs:
        output["correct"] = copying.quote_correct(output["text"], sentences[output["id"]])
        if not output["correct"]:
            failures[output["id"]] = "expected sentence not quoted"
    return _share("quote_exact", outputs, failures)


def score_mixed(references: dict[str, dict], outputs: list[dict], limits: Limits = Limits()) -> dict:
    """The mixed workload: every graded item by its part's own measure (HumanEval pass@1, edit, quote; the
    general items are not graded). ``value`` is the share of graded items correct; ``parts`` has each part's."""
    by_part: dict[str, list[dict]] = {}
    for output in outputs:
        by_part.setdefault(references[output["id"]]["workload"], []).append(output)
    parts = {}
    if by_part.get("humaneval"):
        chosen = by_part["humaneval"]
        results = score_humaneval([references[o["id"]] for o in chosen], [o["text"] for o in chosen], limits)
        parts["humaneval"] = pass_share("pass@1", chosen, results)
    if by_part.get("edit"):
        parts["edit"] = score_edits(references, by_part["edit"], limits)
    if by_part.get("quote"):
        parts["quote"] = score_quotes({o["id"]: references[o["id"]]["sentence"] for o in by_part["quote"]},
                                      by_part["quote"])
    graded = [o for part in parts for o in by_part[part]]
    failures = {k: v for part in parts.values() for k, v in part["failures"].items()}
    summary = _share("mixed_correct", graded, failures)
    summary["parts"] = {name: {k: v for k, v in part.items() if k != "failures"} for name, part in parts.items()}
    summary["ungraded"] = len(outputs) - len(graded)
    return summary
