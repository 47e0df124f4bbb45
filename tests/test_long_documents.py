"""Long prompts built from real documents inside PyPI packages (data/long_documents.py, read through
data/long_sets.py): split by document, no test prompt quoting trained text, lengths from about 1K tokens to
the cap, each question asked over text that answers it. Skipped where the packages are not installed (CI
installs them)."""

import importlib.util
import json
import re

import pytest

from eyas.data import long_documents
from eyas.data.long_documents import FILES, SMALLEST, hotpot_records, installed_file, squad_articles
from eyas.data.long_sets import describe, is_long_set, record_documents, records
from eyas.data.packaged import pip

SETS = ["essays-long-8k", "hotpotqa-long-8k", "squad-long-8k", "writingbench-en-long-8k"]
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
    """Train and test share no group and no quoted line; both splits are the same on every call; prompts
    run from about 1K tokens (SMALLEST characters, or a shorter excerpt of whole pieces) to the cap."""
    assert is_long_set(source) and source.split("-")[0] in describe(source, "test")
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
    if source.startswith("writingbench"):
        assert min(lengths) >= SMALLEST
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
