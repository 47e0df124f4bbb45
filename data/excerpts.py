"""What every long prompt set shares (data/long_sets.py): documents split by document, excerpt sizes that
double from about 1K tokens up to a cap, excerpts cut at a boundary, and short documents bundled.

    sizes(smallest, cap, length)    [smallest, 2 x smallest, ...] up to min(cap, length) characters
    places(length, size)            [(j, fits)]: up to 4 excerpts of `size` spread over a document
    cut(text, size, j, fits, sep)   (start, end) of excerpt j: whole pieces ending at `sep` (a line...)
    split_by_length(docs)           each document's split: by length, every fifth from the third is test
    split_linked(docs)              the same, documents that quote each other kept on one side
    bundles(docs, names, cap, sep)  consecutive documents grouped until each group holds `cap`

A set names its cap in tokens (`-8k`) and turns it into characters at its own rate (CHARS_PER_TOKEN: below
what real tokenizers take on its text, so that an `-8k` prompt fits an 8K context).
"""

from __future__ import annotations

import re

EXCERPTS_PER_SIZE = 4
SPAN_WORDS = 12  # a run of this many words found in two documents is quoted text, not a common phrase
SHARED_SPANS = 10  # runs two documents share before they go to one split


def cap_tokens(source: str, prefix: str) -> int | None:
    """`prefix` or `prefix-Nk` -> N x 1000 (None without a cap); anything else -> -1."""
    if source == prefix:
        return None
    m = re.fullmatch(re.escape(prefix) + r"-(\d+)k", source)
    return int(m.group(1)) * 1000 if m else -1


def sizes(smallest: int, cap: int, length: int) -> list[int]:
    """Excerpt sizes in characters: doubling from `smallest` while they fit both `cap` and the document."""
    out, size = [], smallest
    while size <= min(cap, length):
        out.append(size)
        size *= 2
    return out


def places(length: int, size: int) -> list[tuple[int, int]]:
    """(j, fits) of each excerpt of `size` characters taken from a document of `length`: `fits` excerpts fit
    end to end, up to EXCERPTS_PER_SIZE of them are taken, spread over the document."""
    fits = length // size
    return [(j, fits) for j in range(min(EXCERPTS_PER_SIZE, fits))]


def cut(text: str, size: int, j: int, fits: int, sep: str = "\n") -> tuple[int, int]:
    """(start, end) of excerpt j of `size` characters (of `fits` that fit end to end; the taken ones spread
    over them): it starts after a `sep` and ends at one, so it holds whole pieces and at most `size`
    characters; a first piece longer than `size` is cut at `size`."""
    start = text.rfind(sep, 0, (j * fits // min(EXCERPTS_PER_SIZE, fits)) * size)
    start = 0 if start < 0 else start + len(sep)
    end = text.rfind(sep, start, start + size)
    return start, end if end > start else min(len(text), start + size)


def split_by_length(docs: dict[str, str]) -> dict[str, str]:
    """Each document's split: ranked by length (longest first, then by name), every fifth from the third is
    test, the rest train, so both splits reach the longest documents."""
    ranked = sorted(docs, key=lambda n: (-len(docs[n]), n))
    return {n: "test" if i % 5 == 2 else "train" for i, n in enumerate(ranked)}


def bundles(
    docs: dict[str, str], names: list[str], cap: int, joiner: str, group: dict[str, str] | None = None
) -> list[list[str]]:
    """The documents `names` grouped into consecutive bundles that hold at least `cap` characters once
    joined with `joiner`, so that a set of short documents still reaches its cap; what is left at the end
    joins the last bundle. A document is in one bundle, and documents of one `group` (split_linked's: they
    quote each other) are next to each other in one bundle, so the bundle, held out whole, holds them all."""
    group = group or {n: n for n in names}
    order = {g: i for i, g in reversed(list(enumerate(group[n] for n in names)))}  # a group's first place
    names = sorted(names, key=lambda n: order[group[n]])  # stable: a group's members in their order
    out, current, length = [], [], 0
    for i, n in enumerate(names):
        length += len(docs[n]) + (len(joiner) if current else 0)
        current.append(n)
        closes = i + 1 == len(names) or group[names[i + 1]] != group[n]
        if length >= cap and closes:
            out.append(current)
            current, length = [], 0
    if current and out:
        out[-1] += current
    elif current:
        out.append(current)
    return out


WORD = re.compile(r"[\u4e00-\u9fff]|[^\s\u4e00-\u9fff]+")  # a CJK character is a word of its own


def spans(text: str, words: int = SPAN_WORDS) -> set[int]:
    """Hashes of every run of `words` consecutive words of `text` (whitespace and line breaks ignored)."""
    w = WORD.findall(text)
    return {hash(" ".join(w[i : i + words])) for i in range(len(w) - words + 1)}


def linked(docs: dict[str, str], least: int = SHARED_SPANS) -> dict[str, str]:
    """Each document's group: documents that share at least `least` runs of SPAN_WORDS words (a draft
    and its essay, a request and another built on the same material) are linked, transitively, so a split
    by group never puts quoted text on both sides. -> {document: its group's first document, in order}."""
    parent = {n: n for n in docs}

    def root(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    seen: dict[int, list[str]] = {}
    shared: dict[tuple[str, str], int] = {}
    for n, text in docs.items():
        for h in spans(text):
            for other in seen.setdefault(h, []):
                shared[other, n] = shared.get((other, n), 0) + 1
            seen[h].append(n)
    for (a, b), count in shared.items():
        if count >= least:
            ra, rb = sorted((root(a), root(b)), key=list(docs).index)
            parent[rb] = ra
    return {n: root(n) for n in docs}


def split_linked(docs: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Each document's split, whole groups at a time (`linked`): the groups ranked by their joined length
    (split_by_length), every document taking its group's split. -> (split, group) per document."""
    group = linked(docs)
    joined: dict[str, str] = {}
    for n, g in group.items():
        joined[g] = joined.get(g, "") + docs[n]
    by_group = split_by_length(joined)
    return {n: by_group[g] for n, g in group.items()}, group
