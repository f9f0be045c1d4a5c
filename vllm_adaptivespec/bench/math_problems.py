"""Checked math: seeded multi-step arithmetic word problems with exact integer answers.

Every problem is built from numbers drawn by a seeded `random.Random`, and its answer is computed
here from those numbers (never written by hand); the numbers are kept in ``params`` so a test can
recompute the answer another way. Problem ``i`` of a seed depends only on the seed and ``i``, so
the same seed gives the same problems in every run and on every machine. The kinds take turns
(problem ``i`` is of kind ``KINDS[i % len(KINDS)]``), so any evenly spread subset mixes them.

The model is asked to reason briefly and to end with a line ``Answer: <number>``; `extract_answer`
reads the number back and `answer_correct` checks it exactly.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from fractions import Fraction

DEFAULT_COUNT = 240
DEFAULT_SEED = 0

INSTRUCTION = (
    "Solve the following problem. Reason briefly, step by step, then finish with a last line of the form "
    "`Answer: <number>` that gives the final answer as a whole number (digits only, no units)."
)

NAMES = ("Ava", "Ben", "Chloe", "Diego", "Elena", "Farid", "Grace", "Hiro", "Imani", "Jonas", "Keiko", "Liam",
         "Maya", "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sami", "Tomas", "Uma", "Victor", "Wen", "Yusuf", "Zara")


@dataclass(frozen=True)
class MathProblem:
    id: str
    kind: str
    variant: str
    question: str
    answer: int
    params: dict = field(default_factory=dict)  # the drawn numbers the answer follows from


def _hours(n: int) -> str:
    return f"{n} hour" + ("s" if n != 1 else "")


def _two_names(rng: random.Random) -> tuple[str, str]:
    first, second = rng.sample(NAMES, 2)
    return first, second


# ---- the kinds: each draws numbers, words the question and computes the answer


def _shopping(rng: random.Random) -> tuple[str, dict, str, int]:
    goods = [("notebooks", 2, 9), ("pens", 1, 4), ("mugs", 5, 15), ("shirts", 12, 30), ("books", 8, 25),
             ("candles", 3, 12), ("plant pots", 4, 14), ("towels", 6, 18)]
    (item1, lo1, hi1), (item2, lo2, hi2) = rng.sample(goods, 2)
    name = rng.choice(NAMES)
    while True:
        n1, p1 = rng.randint(2, 9), rng.randint(lo1, hi1)
        n2, p2 = rng.randint(2, 9), rng.randint(lo2, hi2)
        percent = rng.choice((10, 15, 20, 25, 30, 40, 50))
        subtotal = n1 * p1 + n2 * p2
        if subtotal * percent % 100 == 0:
            break
    discounted = subtotal * (100 - percent) // 100
    if rng.random() < 0.5:
        coupon = rng.randint(1, max(1, discounted // 4))
        text = (f"{name} buys {n1} {item1} at ${p1} each and {n2} {item2} at ${p2} each. The shop takes "
                f"{percent}% off the whole bill, and then {name} pays part of it with a ${coupon} gift card. "
                f"How many dollars does {name} pay in cash?")
        return "discount-then-coupon", {"n1": n1, "p1": p1, "n2": n2, "p2": p2, "percent": percent,
                                        "coupon": coupon}, text, discounted - coupon
    text = (f"A shop sells {item1} for ${p1} each and {item2} for ${p2} each. {name} puts {n1} {item1} and "
            f"{n2} {item2} in the basket, and at the till a {percent}% discount is applied to the total. "
            f"How many dollars does {name} pay?")
    return "discount", {"n1": n1, "p1": p1, "n2": n2, "p2": p2, "percent": percent}, text, discounted


def _travel(rng: random.Random) -> tuple[str, dict, str, int]:
    vehicle = rng.choice(("train", "bus", "truck", "ferry", "van", "car"))
    while True:
        s1, t1 = rng.randint(3, 24) * 5, rng.randint(1, 5)
        s2, minutes = rng.randint(3, 24) * 5, rng.choice((15, 20, 30, 40, 45, 90, 100))
        if s2 * minutes % 60 == 0:
            break
    covered = s1 * t1 + s2 * minutes // 60
    if rng.random() < 0.5:
        text = rng.choice((f"A {vehicle} travels at {s1} km per hour for {_hours(t1)}, then at {s2} km per hour for "
                           f"{minutes} minutes. How many kilometres does it cover in total?",
                           f"For the first {_hours(t1)} of a trip a {vehicle} keeps to {s1} km/h; for the next "
                           f"{minutes} minutes it goes {s2} km/h. How far does it go altogether, in kilometres?"))
        return "total", {"s1": s1, "t1": t1, "s2": s2, "minutes": minutes}, text, covered
    extra = rng.randint(5, 200)
    route = covered + extra
    text = (f"A {vehicle} has a {route} km route. It goes {_hours(t1)} at {s1} km/h and then {minutes} minutes "
            f"at {s2} km/h. How many kilometres of the route are still left?")
    return "remaining", {"route": route, "s1": s1, "t1": t1, "s2": s2, "minutes": minutes}, text, extra


def _sharing(rng: random.Random) -> tuple[str, dict, str, int]:
    name = rng.choice(NAMES)
    thing, container = rng.choice((("cookies", "trays"), ("marbles", "bags"), ("stickers", "sheets"),
                                   ("apples", "crates"), ("pencils", "boxes")))
    containers, each = rng.randint(3, 12), rng.randint(6, 30)
    lost = rng.randint(1, 15)
    friends = rng.randint(3, 11)
    rest = containers * each - lost
    params = {"containers": containers, "each": each, "lost": lost, "friends": friends}
    setup = (f"{name} has {containers} {container} with {each} {thing} in each. {lost} of the {thing} are "
             f"damaged and thrown away. The rest are shared among {friends} friends so that each friend gets "
             f"the same number, as many as possible")
    if rng.random() < 0.5:
        text = setup + f"; whatever is left over stays with {name}. How many {thing} does {name} keep?"
        return "leftover", params, text, rest % friends
    text = setup + f". How many {thing} does each friend get?"
    return "share", params, text, rest // friends


def _ages(rng: random.Random) -> tuple[str, dict, str, int]:
    older, younger = _two_names(rng)
    if rng.random() < 0.5:
        child, times, years = rng.randint(2, 15), rng.randint(2, 5), rng.randint(2, 12)
        total = times * child + child + 2 * years
        text = (f"{older} is {times} times as old as {younger}. In {years} years the sum of their ages will be "
                f"{total}. How old is {older} now?")
        return "times-and-sum", {"times": times, "years": years, "total": total}, text, times * child
    then, times, years = rng.randint(2, 12), rng.randint(2, 5), rng.randint(1, 15)
    gap = (times - 1) * then
    text = (f"{older} is {gap} years older than {younger}. {years} years ago, {older} was {times} times as old "
            f"as {younger}. How old is {younger} now?")
    return "gap-and-times", {"gap": gap, "years": years, "times": times}, text, then + years


def _units(rng: random.Random) -> tuple[str, dict, str, int]:
    variant = rng.choice(("ribbon", "flour", "films"))
    name = rng.choice(NAMES)
    if variant == "ribbon":
        feet, inches, piece = rng.randint(3, 30), rng.randint(1, 11), rng.randint(5, 17)
        text = (f"A ribbon is {feet} feet {inches} inches long (1 foot = 12 inches). {name} cuts it into pieces "
                f"that are each {piece} inches long. How many whole pieces does {name} get?")
        return variant, {"feet": feet, "inches": inches, "piece": piece}, text, (12 * feet + inches) // piece
    if variant == "flour":
        kilos, grams, batch = rng.randint(1, 9), rng.randint(10, 990), rng.randint(15, 90) * 10
        text = (f"A bread recipe needs {batch} grams of flour per loaf. {name} has {kilos} kilograms and {grams} "
                f"grams of flour. How many complete loaves can {name} bake?")
        return variant, {"kilos": kilos, "grams": grams, "batch": batch}, text, (1000 * kilos + grams) // batch
    films, hours, minutes, pause = rng.randint(2, 6), rng.randint(1, 2), rng.randint(5, 55), rng.randint(5, 25)
    text = (f"{name} watches {films} films in a row. Each film lasts {_hours(hours)} and "
            f"{minutes} minutes, and there is a {pause}-minute break between one film and the next. How many "
            f"minutes pass from the start of the first film to the end of the last one?")
    return variant, {"films": films, "hours": hours, "minutes": minutes, "pause": pause}, text, (
        films * (60 * hours + minutes) + (films - 1) * pause)


_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
_SHARES = {2: "half", 3: "a third", 4: "a quarter", 5: "a fifth"}


def _inventory(rng: random.Random) -> tuple[str, dict, str, int]:
    place, unit = rng.choice((("warehouse", "boxes"), ("bookshop", "books"), ("bakery", "bags of flour"),
                              ("garage", "tyres"), ("library", "magazines")))
    start = stock = rng.randint(40, 400)
    events: list[list] = []
    sentences = [f"A {place} starts the week with {stock} {unit}."]
    for day in _DAYS[: rng.randint(3, 5)]:
        move = rng.choice(("receive", "ship", "fraction")) if stock > 0 else "receive"
        if move == "fraction":
            divisors = [d for d in _SHARES if stock % d == 0]
            move = "ship" if not divisors else move
        if move == "receive":
            loads, size = rng.randint(2, 6), rng.randint(5, 40)
            stock += loads * size
            events.append(["receive", loads, size])
            sentences.append(f"On {day} it receives {loads} deliveries of {size} {unit} each.")
        elif move == "ship":
            out = rng.randint(1, stock)
            stock -= out
            events.append(["ship", out])
            sentences.append(f"On {day} it sends out {out} {unit}.")
        else:
            part = rng.choice(divisors)
            stock -= stock // part
            events.append(["fraction", part])
            sentences.append(f"On {day} it sends out {_SHARES[part]} of the {unit} it has at that moment.")
    sentences.append(rng.choice((f"How many {unit} does the {place} have at the end?",
                                 f"How many {unit} are in the {place} after {day}?")))
    return "days", {"start": start, "events": events}, " ".join(sentences), stock


def _percentages(rng: random.Random) -> tuple[str, dict, str, int]:
    if rng.random() < 0.5:
        place = rng.choice(("school", "club", "town choir", "summer camp", "company"))
        while True:
            people, p, q = rng.randint(4, 60) * 10, rng.choice(range(5, 100, 5)), rng.choice(range(5, 100, 5))
            if people * p % 100 == 0 and people * p * q % 10000 == 0:  # whole people at both steps
                break
        text = (f"A {place} has {people} members. {p}% of them play a sport, and {q}% of those who play a sport "
                f"play tennis. How many members play tennis?")
        return "of-a-part", {"people": people, "p": p, "q": q}, text, people * p * q // 10000
    item = rng.choice(("jacket", "bicycle", "lamp", "backpack", "guitar", "kettle"))
    while True:
        price, up, down = rng.randint(2, 60) * 10, rng.choice(range(5, 55, 5)), rng.choice(range(5, 55, 5))
        if price * (100 + up) % 100 == 0 and price * (100 + up) * (100 - down) % 10000 == 0:  # whole dollars
            break
    text = (f"A {item} costs ${price}. Its price is raised by {up}%, and later the new price is cut by {down}%. "
            f"What is the final price in dollars?")
    return "up-then-down", {"price": price, "up": up, "down": down}, text, price * (100 + up) * (100 - down) // 10000


# Two different times alone (hours) whose time together, x * y / (x + y), is a whole number of hours.
_WORKER_PAIRS = [(x, y) for x in range(2, 61) for y in range(x + 1, 61) if x * y % (x + y) == 0]


def _together(rng: random.Random) -> tuple[str, dict, str, int]:
    if rng.random() < 0.5:
        while True:
            a, b, leak = rng.randint(3, 20), rng.randint(3, 20), rng.randint(1, 6)
            if a + b > leak:
                break
        minutes = rng.randint(4, 40)
        tank = (a + b - leak) * minutes
        text = (f"An empty tank holds {tank} litres. Pipe A pours in {a} litres per minute and pipe B pours in "
                f"{b} litres per minute, while a leak lets out {leak} litres per minute. With both pipes open, "
                f"how many minutes does it take to fill the tank?")
        return "pipes", {"tank": tank, "a": a, "b": b, "leak": leak}, text, minutes
    x, y = rng.choice(_WORKER_PAIRS)
    first, second = _two_names(rng)
    job = rng.choice(("paint a fence", "tile a floor", "sort a pile of letters", "weed a field"))
    text = rng.choice((f"Alone, {first} can {job} in {x} hours and {second} can do the same job in {y} hours. "
                       f"Working together at these rates, how many hours do they need?",
                       f"It takes {first} {x} hours to {job} alone and {second} {y} hours. If they work on it "
                       f"together, each at the same pace as alone, how many hours does the job take?"))
    return "two-workers", {"x": x, "y": y}, text, x * y // (x + y)


def _areas(rng: random.Random) -> tuple[str, dict, str, int]:
    if rng.random() < 0.5:
        length, width = rng.randint(6, 30), rng.randint(4, 20)
        side = rng.randint(2, min(length, width) - 1)
        cost = rng.randint(2, 9)
        text = (f"A rectangular garden is {length} m long and {width} m wide. A square patio {side} m on each side "
                f"is built in one corner, and the rest of the garden is sown with grass seed costing ${cost} per "
                f"square metre. How many dollars does the seed cost?")
        return "lawn", {"length": length, "width": width, "side": side, "cost": cost}, text, (
            (length * width - side * side) * cost)
    tile = rng.choice((20, 25, 50))
    length, width = rng.randint(2, 8), rng.randint(2, 6)
    per_box = rng.choice((6, 8, 10, 12, 15))
    tiles = (100 * length // tile) * (100 * width // tile)
    text = (f"A room is {length} m by {width} m. Its floor is covered with square tiles {tile} cm on each side, "
            f"sold in boxes of {per_box}. How many boxes are needed (whole boxes only)?")
    return "tiles", {"length": length, "width": width, "tile": tile, "per_box": per_box}, text, -(-tiles // per_box)


def _wages(rng: random.Random) -> tuple[str, dict, str, int]:
    name = rng.choice(NAMES)
    wage, hours = rng.randint(6, 25) * 2, rng.randint(30, 55)  # an even wage: overtime pays whole dollars
    pay = wage * min(hours, 40) + wage * 3 // 2 * max(0, hours - 40)
    rent = rng.randint(50, min(300, pay // 2))
    food = rng.randint(20, min(150, pay - rent - 1))
    text = (f"{name} earns ${wage} an hour for the first 40 hours of a week and one and a half times that rate for "
            f"every hour beyond 40. This week {name} works {hours} hours, then pays ${rent} towards rent and "
            f"${food} for groceries. " + rng.choice(("How many dollars of the week's pay are left?",
                                                     f"How much of the week's pay, in dollars, does {name} keep?")))
    return "overtime", {"wage": wage, "hours": hours, "rent": rent, "food": food}, text, pay - rent - food


def _averages(rng: random.Random) -> tuple[str, dict, str, int]:
    name = rng.choice(NAMES)
    while True:
        scores = [rng.randint(55, 100) for _ in range(rng.randint(3, 5))]
        target = rng.randint(60, 95)
        needed = target * (len(scores) + 1) - sum(scores)
        if 0 <= needed <= 100:
            break
    listed = ", ".join(map(str, scores[:-1])) + f" and {scores[-1]}"
    ask = rng.choice((f"What score on the next test would make the average of all {len(scores) + 1} tests exactly "
                      f"{target}?",
                      f"What must {name} score on test number {len(scores) + 1} to bring the average of all the "
                      f"tests to exactly {target}?"))
    text = f"{name} scored {listed} on the first {len(scores)} tests of a course. {ask}"
    return "next-score", {"scores": scores, "target": target}, text, needed


KINDS = {
    "shopping": _shopping,
    "travel": _travel,
    "sharing": _sharing,
    "ages": _ages,
    "units": _units,
    "inventory": _inventory,
    "percentages": _percentages,
    "together": _together,
    "areas": _areas,
    "wages": _wages,
    "averages": _averages,
}


def generate(count: int = DEFAULT_COUNT, seed: int = DEFAULT_SEED) -> list[MathProblem]:
    """``count`` distinct problems; the same (count, seed) always gives the same list, and a longer
    list of the same seed starts with the shorter one."""
    kinds = list(KINDS)
    problems: list[MathProblem] = []
    seen: set[str] = set()
    for index in range(count):
        kind = kinds[index % len(kinds)]
        for attempt in range(1000):
            rng = random.Random(f"adaptivespec-math:{seed}:{index}:{attempt}")
            variant, params, question, answer = KINDS[kind](rng)
            if question not in seen:
                break
        else:  # pragma: no cover - the kinds have far more than enough numbers
            raise RuntimeError(f"no new {kind} problem for index {index}")
        seen.add(question)
        problems.append(MathProblem(f"math-{index:03d}-{kind}", kind, variant, question, answer, params))
    return problems


def prompt(problem: MathProblem) -> str:
    return f"{INSTRUCTION}\n\n{problem.question}"


# ---- reading the answer back

_ANSWER = re.compile(r"answer\s*(?:is)?\s*[*_]*\s*[:=]", re.I)
# A number: an optional sign, digits with optional thousands commas, an optional decimal part.
_NUMBER = re.compile(r"([-+\u2212]?)(\d{1,3}(?:,\d{3})+(?![\d])|\d+)(?:\.(\d+))?")


def _numbers(text: str) -> list[Fraction]:
    found = []
    for match in _NUMBER.finditer(text):
        sign, whole, decimals = match.groups()
        start = match.start()
        if sign and start > 0 and (text[start - 1].isalnum() or text[start - 1] in ")]"):
            sign = ""  # "3-4", "x-2": a dash between terms, not a minus sign
        value = Fraction(int(whole.replace(",", "")))
        if decimals:
            value += Fraction(int(decimals), 10 ** len(decimals))
        found.append(-value if sign in ("-", "\u2212") else value)
    return found


def extract_answer(text: str) -> int | None:
    """The integer a reply gives: the first number after its last ``Answer:``, else its last number.

    Thousands commas, a ``+``/``-`` sign and an integral decimal part (``12.0``, ``1,250.00``) are
    normalised; a number with a fractional part (``12.5``) or no number at all gives None.
    """
    markers = list(_ANSWER.finditer(text))
    numbers = _numbers(text[markers[-1].end():])[:1] if markers else []
    if not numbers:
        numbers = _numbers(text)[-1:]
    if not numbers or numbers[0].denominator != 1:
        return None
    return int(numbers[0])


def answer_correct(text: str, expected: int) -> bool:
    return extract_answer(text) == expected
