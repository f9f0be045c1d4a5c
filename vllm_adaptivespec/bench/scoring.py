"""Accuracy of generated answers: HumanEval pass@1 (code run in the sandbox) and checked math (exact match)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

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
