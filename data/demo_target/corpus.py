"""The demo target's training data: short harmony-style conversations, generated from a seed.

Each conversation is one user question and one assistant answer with an `analysis` channel
(step-by-step reasoning, the `thinking` key) and a `final` channel (the answer, `content`).
Task families: adding, subtracting and comparing two-digit numbers, parity, sorting numbers
or words, reversing and counting word lists, unit conversions, and looking up colours of
things and capitals of made-up countries.

Every family has several question phrasings, each with its own final-answer phrasing, and
several interchangeable openings of the reasoning. Given the question the reasoning steps and
the final answer are fully determined; only the opening sentence is a free choice. So a small
model can learn the task, while its next-token distribution keeps some real uncertainty.

Records use the OpenAI messages layout:

    {"messages": [{"role": "user", "content": QUESTION},
                  {"role": "assistant", "thinking": REASONING, "content": ANSWER}]}
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from eyas.infra.io import write_jsonl

WORDS = (
    "apple",
    "bread",
    "cat",
    "dog",
    "egg",
    "fish",
    "goat",
    "hat",
    "ink",
    "jam",
    "kite",
    "lamp",
    "moon",
    "nut",
    "owl",
    "pen",
    "rose",
    "sun",
    "tree",
    "vase",
    "wolf",
    "yarn",
    "zebra",
)  # distinct first letters
COLOURS = {
    "sky": "blue",
    "grass": "green",
    "snow": "white",
    "coal": "black",
    "banana": "yellow",
    "tomato": "red",
    "carrot": "orange",
    "plum": "purple",
    "cloud": "grey",
    "chocolate": "brown",
    "lemon": "yellow",
    "leaf": "green",
}
CAPITALS = {
    "Zorland": "Mivo",
    "Quenta": "Parsa",
    "Belmor": "Tisk",
    "Oravia": "Lune",
    "Kestra": "Dovan",
    "Varnok": "Eshel",
    "Pindar": "Rulo",
    "Mossa": "Kelt",
    "Tirvan": "Obra",
    "Ulmet": "Sarn",
}
UNITS = (
    ("hours", "hour", "minutes", 60),
    ("minutes", "minute", "seconds", 60),
    ("days", "day", "hours", 24),
    ("weeks", "week", "days", 7),
    ("meters", "meter", "centimeters", 100),
    ("kilograms", "kilogram", "grams", 1000),
    ("feet", "foot", "inches", 12),
)


class Sample(NamedTuple):
    """One conversation: the user's question, the reasoning (analysis channel), the answer (final channel)."""

    question: str
    analysis: str
    final: str


def _listing(items: Iterable) -> str:
    """The items joined as "a, b, c"."""
    return ", ".join(str(x) for x in items)


def _add(rng: random.Random) -> Sample:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    s = a + b
    q, f = rng.choice(
        [
            ("What is {a} plus {b}?", "{a} plus {b} is {s}."),
            ("Add {a} and {b}.", "The sum is {s}."),
            ("Compute {a} + {b}.", "{a} + {b} = {s}."),
            ("What do you get when you add {a} to {b}?", "You get {s}."),
        ]
    )
    opener = rng.choice(
        [
            "We need to add {a} and {b}.",
            "Add the digits column by column.",
            "Let me add {a} and {b} step by step.",
        ]
    )
    ones, carry = a % 10 + b % 10, (a % 10 + b % 10) // 10
    steps = f"Ones: {a % 10} + {b % 10} = {ones}."
    steps += f" Write {ones % 10}, carry 1." if carry else ""
    steps += f" Tens: {a // 10} + {b // 10}{' + 1' if carry else ''} = {a // 10 + b // 10 + carry}."
    fill = dict(a=a, b=b, s=s)
    return Sample(
        q.format(**fill), f"{opener.format(**fill)} {steps} So the answer is {s}.", f.format(**fill)
    )


def _subtract(rng: random.Random) -> Sample:
    a = rng.randint(20, 99)
    b = rng.randint(10, a - 1)
    d = a - b
    q, f = rng.choice(
        [
            ("What is {a} minus {b}?", "{a} minus {b} is {d}."),
            ("Subtract {b} from {a}.", "The difference is {d}."),
            ("Compute {a} - {b}.", "{a} - {b} = {d}."),
            ("What is left if you take {b} away from {a}?", "{d} is left."),
        ]
    )
    opener = rng.choice(
        ["We need to subtract {b} from {a}.", "Subtract column by column.", "Let me work out {a} - {b}."]
    )
    a1, a0, b1, b0 = a // 10, a % 10, b // 10, b % 10
    if a0 >= b0:
        steps = f"Ones: {a0} - {b0} = {a0 - b0}. Tens: {a1} - {b1} = {a1 - b1}."
    else:
        steps = (
            f"Ones: {a0} is less than {b0}, so borrow: {a0 + 10} - {b0} = {a0 + 10 - b0}."
            f" Tens: {a1} - 1 - {b1} = {a1 - 1 - b1}."
        )
    fill = dict(a=a, b=b, d=d)
    return Sample(
        q.format(**fill), f"{opener.format(**fill)} {steps} So the answer is {d}.", f.format(**fill)
    )


def _compare(rng: random.Random) -> Sample:
    a, b = rng.sample(range(10, 100), 2)
    hi, lo = max(a, b), min(a, b)
    kind = rng.randrange(3)
    if kind == 0:
        q, f = f"Which is larger, {a} or {b}?", f"{hi} is larger."
    elif kind == 1:
        q, f = f"Which number is smaller: {a} or {b}?", f"{lo} is smaller."
    else:
        q = f"Is {a} greater than {b}?"
        f = f"Yes, {a} is greater than {b}." if a > b else f"No, {a} is less than {b}."
    opener = rng.choice(
        [f"Compare {a} and {b}.", "Look at the tens digits first.", "Let me compare the two numbers."]
    )
    if a // 10 != b // 10:
        steps = f"The tens digits are {a // 10} and {b // 10}. {hi // 10} is bigger,"
    else:
        steps = (
            f"The tens digits are both {a // 10}. The ones digits are {a % 10} and {b % 10}. "
            f"{hi % 10} is bigger,"
        )
    return Sample(q, f"{opener} {steps} so {hi} is the larger number.", f)


def _parity(rng: random.Random) -> Sample:
    n = rng.randint(10, 99)
    p = "even" if n % 2 == 0 else "odd"
    kind = rng.randrange(3)
    if kind == 0:
        q, f = f"Is {n} even or odd?", f"{n} is {p}."
    elif kind == 1:
        q, f = f"Tell me whether {n} is odd or even.", f"It is {p}."
    else:
        q, f = f"Is {n} an even number?", f"Yes, {n} is even." if p == "even" else f"No, {n} is odd."
    opener = rng.choice(
        [
            "Check the last digit.",
            "A number is even when its last digit is even.",
            f"Look at the ones digit of {n}.",
        ]
    )
    return Sample(q, f"{opener} The last digit of {n} is {n % 10}. {n % 10} is {p}, so {n} is {p}.", f)


def _sort_numbers(rng: random.Random) -> Sample:
    xs = rng.sample(range(1, 10), rng.randint(3, 4))
    descending = rng.random() < 0.5
    ys = sorted(xs, reverse=descending)
    if descending:
        q, f = rng.choice(
            [
                ("Sort {xs} from largest to smallest.", "{ys}"),
                ("Arrange in decreasing order: {xs}.", "In decreasing order: {ys}."),
            ]
        )
        first, last = "largest", "smallest"
    else:
        q, f = rng.choice(
            [
                ("Sort {xs} from smallest to largest.", "{ys}"),
                ("Put these numbers in increasing order: {xs}.", "In increasing order: {ys}."),
            ]
        )
        first, last = "smallest", "largest"
    opener = rng.choice(
        ["We need to order the numbers.", "Let me sort them one by one.", "Find the numbers in order."]
    )
    steps = " ".join(
        [f"The {first} is {ys[0]}."] + [f"Next is {y}." for y in ys[1:-1]] + [f"The {last} is {ys[-1]}."]
    )
    fill = dict(xs=_listing(xs), ys=_listing(ys))
    return Sample(q.format(**fill), f"{opener} {steps}", f.format(**fill))


def _sort_words(rng: random.Random) -> Sample:
    ws = rng.sample(WORDS, rng.randint(3, 4))
    ys = sorted(ws)
    q, f = rng.choice(
        [
            ("Sort these words alphabetically: {ws}.", "{ys}"),
            ("Put {ws} in alphabetical order.", "Alphabetical order: {ys}."),
            ("Order these words from A to Z: {ws}.", "From A to Z: {ys}."),
        ]
    )
    opener = rng.choice(
        ["Look at the first letters.", "We sort by the first letter.", "Let me order the words."]
    )
    fill = dict(ws=_listing(ws), ys=_listing(ys))
    return Sample(
        q.format(**fill),
        f"{opener} First letters: {_listing(w[0] for w in ws)}. In order: {fill['ys']}.",
        f.format(**fill),
    )


def _reverse(rng: random.Random) -> Sample:
    ws = rng.sample(WORDS, rng.randint(3, 4))
    ys = ws[::-1]
    q, f = rng.choice(
        [
            ("Reverse the list: {ws}.", "{ys}"),
            ("Write {ws} in reverse order.", "Reversed: {ys}."),
            ("What is {ws} backwards?", "Backwards it is {ys}."),
        ]
    )
    opener = rng.choice(["Read the list from the end.", "We start from the last item.", "Let me reverse it."])
    steps = f"There are {len(ws)} items. The last is {ys[0]}, then " + ", then ".join(ys[1:-1])
    steps += f", and the first is {ys[-1]}."
    fill = dict(ws=_listing(ws), ys=_listing(ys))
    return Sample(q.format(**fill), f"{opener} {steps}", f.format(**fill))


def _count(rng: random.Random) -> Sample:
    pool = rng.sample(WORDS, 3)
    target = pool[0]
    ws = [rng.choice(pool) for _ in range(rng.randint(3, 5))]
    if target not in ws:
        ws[rng.randrange(len(ws))] = target
    c = ws.count(target)
    times = "time" if c == 1 else "times"
    q, f = rng.choice(
        [
            ("How many times does {w} appear in: {ws}?", "{w} appears {c} {times}."),
            ("Count the word {w} in: {ws}.", "The count is {c}."),
            ("In {ws}, how often is {w} listed?", "{c} {times}."),
        ]
    )
    opener = rng.choice(["Go through the list.", f"Count each {target}.", "Let me count one by one."])
    seen, marks = 0, []
    for w in ws:
        seen += w == target
        marks.append(f"{w} {seen}" if w == target else w)
    steps = f"{_listing(marks)}. So {target} appears {c} {times}."
    fill = dict(w=target, ws=_listing(ws), c=c, times=times)
    return Sample(q.format(**fill), f"{opener} {steps}", f.format(**fill))


def _convert(rng: random.Random) -> Sample:
    big, one, small, factor = rng.choice(UNITS)
    n = rng.randint(2, 9)
    r = n * factor
    q, f = rng.choice(
        [
            ("How many {small} are in {n} {big}?", "{n} {big} is {r} {small}."),
            ("Convert {n} {big} to {small}.", "That is {r} {small}."),
            ("{n} {big} is how many {small}?", "{r} {small}."),
        ]
    )
    opener = rng.choice(["This is a unit conversion.", f"We convert {big} to {small}.", "Let me multiply."])
    fill = dict(n=n, big=big, small=small, r=r)
    return Sample(
        q.format(**fill),
        f"{opener} One {one} is {factor} {small}. {n} times {factor} is {r}.",
        f.format(**fill),
    )


def _colour(rng: random.Random) -> Sample:
    thing, colour = rng.choice(sorted(COLOURS.items()))
    q, f = rng.choice(
        [
            ("What colour is the {t}?", "The {t} is {c}."),
            ("Tell me the colour of the {t}.", "It is {c}."),
            ("Which colour does the {t} have?", "{C}."),
        ]
    )
    opener = rng.choice(
        ["This is a lookup.", f"Let me recall the colour of the {thing}.", "The user asks about a colour."]
    )
    fill = dict(t=thing, c=colour, C=colour.capitalize())
    return Sample(
        q.format(**fill), f"{opener} From my colour table, the {thing} is {colour}.", f.format(**fill)
    )


def _capital(rng: random.Random) -> Sample:
    country, city = rng.choice(sorted(CAPITALS.items()))
    q, f = rng.choice(
        [
            ("What is the capital of {x}?", "The capital of {x} is {y}."),
            ("Name the capital city of {x}.", "It is {y}."),
            ("Which city is the capital of {x}?", "{y} is the capital of {x}."),
        ]
    )
    opener = rng.choice(
        ["This is a lookup.", f"Let me recall the capital of {country}.", "The user asks about a capital."]
    )
    fill = dict(x=country, y=city)
    return Sample(
        q.format(**fill),
        f"{opener} From my table of countries, the capital of {country} is {city}.",
        f.format(**fill),
    )


FAMILIES: dict[str, Callable[[random.Random], Sample]] = {
    "add": _add,
    "subtract": _subtract,
    "compare": _compare,
    "parity": _parity,
    "sort_numbers": _sort_numbers,
    "sort_words": _sort_words,
    "reverse": _reverse,
    "count": _count,
    "convert": _convert,
    "colour": _colour,
    "capital": _capital,
}


def generate_samples(n: int, seed: int) -> list[Sample]:
    """`n` samples, families drawn uniformly; the same (n, seed) always gives the same list."""
    rng = random.Random(seed)
    makers = list(FAMILIES.values())
    return [rng.choice(makers)(rng) for _ in range(n)]


def to_record(sample: Sample) -> dict:
    """A sample in the OpenAI messages layout, the analysis text under `thinking`."""
    return {
        "messages": [
            {"role": "user", "content": sample.question},
            {"role": "assistant", "thinking": sample.analysis, "content": sample.final},
        ]
    }


def generate_conversations(n: int, seed: int) -> list[dict]:
    """`n` conversations as messages records (see the module docstring); deterministic in `seed`."""
    return [to_record(s) for s in generate_samples(n, seed)]


def write_prompts(path: str | Path, n: int, seed: int) -> None:
    """Write the user turns of `generate_conversations(n, seed)` as JSONL, one
    `{"messages": [{"role": "user", "content": ...}]}` per line (atomically)."""
    write_jsonl(
        path, ({"messages": [{"role": "user", "content": s.question}]} for s in generate_samples(n, seed))
    )
