"""Long prompts from the Python standard library's sources (data/long_text.py) and τ by prompt length
(eval: `by_length` in every row of eyas's loop, report.md's "τ by prompt length")."""

import json
import re
import shutil

import pytest

from eyas.data.long_text import GENERAL, QUESTIONS, SMALLEST, cap_chars, documents, records, splits

DOC = re.compile(
    r"^Here is part of Python's standard library \(([\w.]+)\):\n\n```python\n(.*)\n```\n\n(.+)$", re.S
)


def parsed(rows: list[dict]) -> list[tuple[str, str, str]]:
    """-> (document, excerpt, question) of each record."""
    out = []
    for r in rows:
        m = DOC.match(r["prompt"])
        assert m, r["prompt"][:200]
        out.append(m.groups())
    return out


@pytest.mark.parametrize("source", ["stdlib-long-8k", "stdlib-long"])
def test_stdlib_sets_split_by_document_and_span_doubling_sizes(source):
    """Train and test quote disjoint documents, each excerpt is a piece of its document's text of one of the
    doubling sizes (whole lines: at most its size), each prompt ends with a question (about a function the
    excerpt defines where it defines one), and the set is the same on every call."""
    docs = documents()
    by_split = {s: parsed(records(source, s)) for s in ("train", "test")}
    assert records(source, "test") == records(source, "test")
    names = {s: {d for d, _, _ in rows} for s, rows in by_split.items()}
    assert names["train"] and names["test"] and not names["train"] & names["test"]
    assert all(splits(docs)[d] == s for s, ns in names.items() for d in ns)
    sizes = [SMALLEST * 2**i for i in range(20) if SMALLEST * 2**i <= cap_chars(source)]
    for s, rows in by_split.items():
        for doc, excerpt, question in rows:
            assert excerpt in docs[doc]
            assert any(size // 2 < len(excerpt) <= size for size in sizes), (doc, len(excerpt))
            asked = re.findall(r"`(\w+)`", question)  # a function the excerpt defines, or none
            assert question in {q.format(name=n) for q in QUESTIONS for n in asked} | {GENERAL}
            assert all(re.search(rf"def {n}\s*\(", excerpt) for n in asked)
    longest = max(len(e) for _, e, _ in by_split["test"])
    assert longest > sizes[-1] // 2  # the test split reaches the largest size


def test_the_prompts_stage_takes_the_train_split():
    """data.prompts: stdlib-long-Nk reads the train split only."""
    from eyas.data.prompts import load_conversations

    convs = load_conversations("stdlib-long-2k")
    test_docs = {d for d, _, _ in parsed(records("stdlib-long-2k", "test"))}
    assert len(convs) == len(records("stdlib-long-2k", "train")) > 100
    asked = parsed([{"prompt": c[0]["content"]} for c in convs])
    assert not {d for d, _, _ in asked} & test_docs


def test_a_documents_excerpts_are_one_group_that_the_tuning_split_holds_out_whole(tmp_path):
    """A document's excerpts overlap (each size's first starts at the top: the shorter is a prefix of the
    longer), so the prompts stage records the document as each prompt's group, and the held-out split
    (data/splits.py, through conversation_of) takes a document's excerpts together."""
    from eyas.data.long_text import record_documents
    from eyas.data.prompts import read_prompts, run_prompts
    from eyas.data.regenerate import conversation_of
    from eyas.data.splits import split_validation
    from eyas.recipes.load import load_recipe

    rows = records("stdlib-long-8k", "train")
    docs = record_documents("stdlib-long-8k", "train")
    assert docs == [d for d, _, _ in parsed(rows)]
    by_doc: dict[str, list[str]] = {}
    for d, excerpt, _ in parsed(rows):
        by_doc.setdefault(d, []).append(excerpt)
    nested = [d for d, es in by_doc.items() if any(a != b and b.startswith(a) for a in es for b in es)]
    assert len(nested) > 10  # why they go together
    recipe = load_recipe(
        {"data": {"prompts": [{"source": "stdlib-long-8k", "name": "stdlib"}], "num_prompts": 60}}
    )
    run_prompts(recipe, tmp_path, progress=False)
    prompts = read_prompts(tmp_path, "train")
    for p in prompts:
        doc, _, _ = parsed([{"prompt": p["messages"][-1]["content"]}])[0]
        assert p["group"] == f"stdlib:{doc}" and p["group"] == f"stdlib:{docs[int(p['id'].split(':')[1])]}"
    groups = [conversation_of({"id": p["id"], "conversation": p["id"], "group": p["group"]}) for p in prompts]
    assert len(set(groups)) < len(groups)  # several excerpts of a document were chosen
    train, held = split_validation(groups, 0.2, 0)
    assert held and not {groups[i] for i in train} & {groups[i] for i in held}


def test_eval_reports_tau_by_prompt_length(demo_run, tmp_path):
    """The demo's draft over 3 stdlib-long prompts (1-2K tokens with the demo's tokenizer) and 3 short ones:
    each row's by_length splits its prompts into the two buckets, whose verifications and accepted drafts
    add up to the row's; report.md has the table."""
    from eyas.cli import main

    run = tmp_path / "run"
    shutil.copytree(demo_run, run, ignore=shutil.ignore_patterns("capture"))
    short = ["Write a haiku about rivers.", "What is 12 times 7?", "Name three colors of the rainbow."]
    rows = [{"prompt": r["prompt"]} for r in records("stdlib-long-1k", "test")[:3]] + [
        {"prompt": p} for p in short
    ]
    prompts = tmp_path / "mixed.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [
        "eval",
        str(run),
        "--prompts",
        f"mixed={prompts}",
        "--k",
        "3",
        "--temperature",
        "0",
        "--no-progress",
    ]
    assert main([*args, "--concurrency", "1"]) == 0
    report = json.loads((run / "report.json").read_text())
    (row,) = [r for r in report["results"] if r["engine"] == "eyas"]
    b = row["by_length"]
    assert list(b) == ["<1K", "1-2K"] and [v["num_prompts"] for v in b.values()] == [3, 3]
    assert sum(v["target_forwards"] for v in b.values()) == row["target_forwards"]
    accepted = sum((v["acceptance_length"] - 1) * v["target_forwards"] for v in b.values())
    assert accepted == pytest.approx((row["acceptance_length"] - 1) * row["target_forwards"], abs=1e-9)
    assert all(len(v["per_position_acceptance"]) == 3 for v in b.values())
    assert all(v["draft_ms_per_round"] > 0 for v in b.values())  # concurrency 1: each round is one prompt's
    md = (run / "report.md").read_text()
    assert "## τ by prompt length" in md and "| draft | benchmark | T | C | shape | <1K | 1-2K |" in md
    assert f"; 3; {b['<1K']['draft_ms_per_round']:.1f} ms)" in md


def test_draft_time_by_prompt_splits_rounds_at_each_prefill():
    """One request at a time: each prompt's decode steps (those after its prefill) give its draft seconds
    (a step's time outside the target's verification) and rounds; by_length averages them per round over
    a bucket. A step of two rows (concurrency > 1) belongs to no one prompt: None."""
    from eyas.eval.load import by_length, draft_time_by_prompt
    from eyas.serve.decoding.engine import StepStats

    def step(kind, target_s, total_s, rows=1):
        return StepStats(kind, rows, 4, 100, target_s, total_s, 1)

    steps = [step("prefill", 0.5, 0.5), step("decode", 0.1, 0.4), step("decode", 0.1, 0.2)]
    steps += [step("prefill", 0.9, 0.9), step("decode", 0.2, 0.8)]
    rounds = draft_time_by_prompt(steps)
    assert rounds == [(pytest.approx(0.4), 2), (pytest.approx(0.6), 1)]
    out = by_length([[2, 2], [3]], [[1, 1], [2]], 3, [100, 1500], rounds)
    assert out["<1K"]["draft_ms_per_round"] == pytest.approx(200.0)
    assert out["1-2K"]["draft_ms_per_round"] == pytest.approx(600.0)
    assert draft_time_by_prompt([step("prefill", 0.5, 0.5, rows=2), step("decode", 0.1, 0.4, rows=2)]) is None
