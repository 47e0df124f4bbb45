"""Long prompts built from real documents inside PyPI packages (data/long_documents.py, read through
data/long_sets.py): split by document, no test prompt quoting trained text, lengths from about 1K tokens to
the cap, each question asked over text that answers it. Skipped where the packages are not installed (CI
installs them)."""

import importlib.util
import json
import re

import pytest

from eyas.data import long_documents
from eyas.data.excerpts import SHARED_SPANS, bundles, spans, split_linked
from eyas.data.long_documents import (
    ESSAY_JOINER,
    FILES,
    SMALLEST,
    estimated_tokens,
    hotpot_records,
    installed_file,
    squad_articles,
)
from eyas.data.long_sets import describe, is_long_set, record_documents, records
from eyas.data.packaged import pip

SETS = ["essays-long-8k", "hotpotqa-long-8k", "squad-long-8k", "writingbench-en-long-8k"]
SETS += ["writingbench-long-8k"]
CAP_8K = 8000 * long_documents.CHARS_PER_TOKEN


@pytest.fixture(autouse=True)
def installed():
    missing = [w for w in FILES.values() if importlib.util.find_spec(w.module) is None]
    if missing:
        pytest.skip(f"not installed: `{pip(missing)}`")


def pieces(prompt: str, least: int = 120) -> set[str]:
    """The prompt's lines of at least `least` characters: text quoted from a document (the tasks and
    headers are shorter)."""
    return {line.strip() for line in prompt.split("\n") if len(line.strip()) >= least}


@pytest.mark.parametrize("source", SETS)
def test_long_document_sets_split_by_document_and_quote_no_trained_text(source):
    """Train and test share no group and no quoted line (a line of 120 characters: HotpotQA's passages and
    SQuAD's paragraphs are one line each; essays are wrapped, see the next test); both splits are the same
    on every call; prompts run from about 1K tokens (SMALLEST characters, or a shorter excerpt of whole
    pieces) to the cap."""
    file = FILES[long_documents.set_of(source)[0].removesuffix("-en")].member.rsplit("/", 1)[-1]
    assert is_long_set(source) and file in describe(source, "test")
    rows = {s: records(source, s) for s in ("train", "test")}
    groups = {s: record_documents(source, s) for s in ("train", "test")}
    assert rows["test"] == records(source, "test") and len(groups["test"]) == len(rows["test"])
    assert len(rows["train"]) > 2 * len(rows["test"]) > 0
    assert not set(groups["train"]) & set(groups["test"])
    trained = set().union(*(pieces(r["prompt"]) for r in rows["train"]))
    quoted = set().union(*(pieces(r["prompt"]) for r in rows["test"]))
    assert quoted and not quoted & trained
    lengths = [len(r["prompt"]) for s in rows for r in rows[s]]
    assert max(lengths) <= CAP_8K + 600  # the cap, and the task or question after the text
    if source.startswith("writingbench"):  # requests as given, measured in estimated tokens (Chinese ones)
        tokens = [estimated_tokens(r["prompt"]) for s in rows for r in rows[s]]
        assert SMALLEST / long_documents.CHARS_PER_TOKEN <= min(tokens) and max(tokens) <= 8000
    else:
        assert max(lengths) > CAP_8K / 2 and min(lengths) < 2 * SMALLEST


def test_hotpotqa_prompts_hold_their_question_and_all_its_passages():
    """Each prompt asks one HotpotQA question over its own 10 passages (the 2 that answer it among them) and
    other questions' passages of its bundle; a passage title a test question reads is in no train prompt."""
    recs = {r["question"]: r for r in hotpot_records(installed_file(FILES["hotpotqa"])[0])}
    test_titles = set()
    for split in ("test", "train"):
        for row in records("hotpotqa-long-8k", split)[::97]:
            question = re.search(r"\n\nQuestion: (.*)\n", row["prompt"]).group(1)
            rec = recs[question]
            titles = re.findall(r"^Document \d+: (.*)$", row["prompt"], re.M)
            assert {t for t, _ in rec["context"]} <= set(titles)
            assert {t for t, _ in rec["supporting_facts"]} <= set(titles)
            if split == "test":
                test_titles |= set(titles)
            else:
                assert not test_titles & set(titles)


def test_squad_questions_are_asked_over_the_paragraph_that_answers_them():
    """Every question a SQuAD prompt asks is one of an answerable paragraph inside its excerpt."""
    _, questions = squad_articles(installed_file(FILES["squad"])[0])
    for row in records("squad-long-8k", "test"):
        text, _, asked = row["prompt"].rpartition("\n\nAnswer each question from the articles above")
        for q in re.findall(r"^\d+\. (.*)$", asked, re.M):
            assert any(q in qs and para in text for pqs in questions.values() for para, qs in pqs)


def test_essays_are_found_by_their_date_lines():
    """212 essays from one 3.05M-character text, none lost: joined, they are the file's text."""
    path = installed_file(FILES["essays"])[0]
    essays = long_documents.essays(path)
    text = json.loads(path.read_text())["text"]
    assert len(essays) == 212
    assert re.sub(r"\s", "", "".join(essays.values())) == re.sub(r"\s", "", text)
    assert all(re.match(rf"({long_documents.MONTHS}) (19|20)\d\d", e) for e in list(essays.values())[1:])


def split_documents(name: str) -> tuple[dict[str, str], dict[str, str]]:
    """(documents, each one's split) of a set whose split is by linked documents."""
    if name == "essays":
        path = installed_file(FILES["essays"])[0]
        return long_documents.essays(path), long_documents.essay_splits(path)[0]
    if name == "writingbench":
        return long_documents.requests(installed_file(FILES["writingbench"])[0])[:2]
    articles = squad_articles(installed_file(FILES["squad"])[0])[0]
    return articles, split_linked(articles)[0]


@pytest.mark.parametrize("name", ["essays", "writingbench", "squad"])
def test_documents_that_quote_each_other_go_to_one_split(name):
    """No train document shares SHARED_SPANS runs of 12 words with a test one: the essay "The Age of the
    Essay" and its draft inside "A Version 1.0" (5K characters in common), WritingBench requests built on the
    same material (request-462 and 463 share 9,755 of 9,793 characters) go to one split. By index alone
    (every fifth request) the largest pair shares thousands. And every line of a test essay prompt is in a
    test essay. (Split by index alone, WritingBench's worst pair shares 9,138 runs; the essays split by length
    alone, 856.)"""
    docs, split = split_documents(name)
    owner: dict[int, set] = {}
    for n in docs:
        if split[n] == "train":
            for h in spans(docs[n]):
                owner.setdefault(h, set()).add(n)
    shared = {}
    for n in docs:
        if split[n] == "test":
            for h in spans(docs[n]):
                for m in owner.get(h, ()):
                    shared[n, m] = shared.get((n, m), 0) + 1
    assert max(shared.values(), default=0) < SHARED_SPANS
    assert {split[n] for n in docs} == {"train", "test"}
    if name == "writingbench":  # the prompts' group is the linked group: one hold-out unit in training
        groups = dict(zip(*(f("writingbench-long", "train") for f in (record_documents, records))))
        assert len(set(groups)) < len(records("writingbench-long", "train"))
    if name == "essays":
        path = installed_file(FILES["essays"])[0]
        _, linked_to = long_documents.essay_splits(path)
        train = [n for n in docs if split[n] == "train"]
        for members in bundles(docs, train, CAP_8K, ESSAY_JOINER, linked_to):  # a linked group in one bundle
            assert all(linked_to[m] in members for m in members)
        assert len(set(linked_to.values())) < len(docs)
        test_text = "\n".join(d for n, d in docs.items() if split[n] == "test")
        for row in records("essays-long-8k", "test")[::5]:
            excerpt = row["prompt"].split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
            lines = [x for x in excerpt.split("\n") if len(x) > 40 and x != ESSAY_JOINER.strip()]
            assert lines and all(x in test_text for x in lines)
