"""Long prompts from real text that every machine has: the running Python's standard library sources.

No hub, no download: each prompt is an excerpt of one stdlib module or package (its files joined, each
under a `# file:` line) followed by a question about that excerpt, usually about a function it defines.
Excerpt sizes double from about 1K tokens up to a cap, so one set spans prompt lengths from 1K tokens to a
target's context:

    stdlib-long         excerpts up to 320,000 characters (128K tokens at CHARS_PER_TOKEN, 2.5 a token)
    stdlib-long-8k      up to 20,000 characters (8K tokens at 2.5): for SmolLM2's 8,192-token context
    stdlib-long-Nk      up to N x 2,500 characters

SmolLM2's tokenizer takes 3.7 characters a token on this text: stdlib-long-8k's prompts run from about 700
to 7,354 tokens (the test split, Python 3.11). A tokenizer that takes fewer characters a token gives longer
prompts than the name says (regeneration skips those over data.max_prompt_tokens).

Splits are by document (a module or a package): ranked by length, every fifth is `test` (evaluation:
`eval.benchmarks`), the rest `train` (`data.prompts`), so no evaluation prompt quotes text a draft was trained
on, and both splits reach the longest excerpts. The set depends on the Python version (its stdlib): the
source string names it.
"""

from __future__ import annotations

import random
import re
import sys
import sysconfig
from pathlib import Path

from eyas.data.excerpts import cut, places, sizes, split_by_length

CHARS_PER_TOKEN = 2.5  # the caps' rate: below what real tokenizers take for code (SmolLM2's: 3.7)
SMALLEST = 2_500  # characters of the shortest excerpt (about 1K tokens at the cap's rate)
SKIP = {"test", "idlelib", "site-packages", "__pycache__", "lib2to3", "tkinter", "turtledemo", "ensurepip"}
NAME = re.compile(r"^stdlib-long(?:-(\d+)k)?$")
DEF = re.compile(r"^\s*(?:async\s+)?def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)
QUESTIONS = (
    "What does `{name}` in the code above do, and what does it return?",
    "Explain step by step how `{name}` above works.",
    "Which inputs make `{name}` above behave differently, and how?",
    "Describe what `{name}` in this code is for, in a short paragraph.",
)
GENERAL = "Summarize what the code above does and how its parts fit together."


def is_long_text(source: str) -> bool:
    """Whether `source` names this module's prompt sets (stdlib-long, stdlib-long-Nk)."""
    return NAME.match(source) is not None


def cap_chars(source: str) -> int:
    """The longest excerpt of a set name, in characters."""
    k = NAME.match(source).group(1)
    return int(k) * 1000 * CHARS_PER_TOKEN if k else 320_000


def describe(source: str, split: str) -> str:
    """Where a set's records come from, for reports."""
    return f"{source}: Python {sys.version.split()[0]} standard library, {split} split (data/long_text.py)"


def documents() -> dict[str, str]:
    """Each top-level stdlib module and package (its .py files joined, sorted) -> its text."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = {}
    for path in sorted(root.iterdir()):
        if path.name in SKIP or path.name.startswith((".", "_")):
            continue
        if path.suffix == ".py":
            docs[path.stem] = path.read_text(errors="replace")
        elif (path / "__init__.py").is_file():
            files = sorted(p for p in path.rglob("*.py") if not SKIP & set(p.relative_to(root).parts))
            docs[path.name] = "\n".join(
                f"# file: {f.relative_to(root)}\n{f.read_text(errors='replace')}" for f in files
            )
    return docs


def splits(docs: dict[str, str]) -> dict[str, str]:
    """Each document's split (data/excerpts.py split_by_length)."""
    return split_by_length(docs)


def records(source: str, split: str) -> list[dict]:
    """The prompt set `source` (stdlib-long[-Nk]) of `split` (train | test) -> {"prompt"} records, in a
    fixed order: per document, per excerpt size (doubling from SMALLEST to the cap), up to 4 excerpts
    spread over the document."""
    return [{"prompt": prompt(*e)} for e in _excerpts(source, split)]


def record_documents(source: str, split: str) -> list[str]:
    """The document each of records(source, split) quotes, in the same order. A document's excerpts overlap
    (each size's first starts at its top, a longer one holds the shorter ones), so the prompts stage groups
    them: training's held-out split takes a document's excerpts whole (data/splits.py)."""
    return [e[0] for e in _excerpts(source, split)]


def _excerpts(source: str, split: str) -> list[tuple[str, str, int, int, int]]:
    """(document, its text, excerpt size, j, excerpts of that size that fit) of each record, in order."""
    if split not in ("train", "test"):
        raise ValueError(f"{source}: split {split!r} (expected train or test)")
    cap = cap_chars(source)
    docs = documents()
    split_by_doc = splits(docs)
    return [
        (name, text, size, j, fits)
        for name, text in docs.items()
        if split_by_doc[name] == split
        for size in sizes(SMALLEST, cap, len(text))
        for j, fits in places(len(text), size)
    ]


def prompt(name: str, text: str, size: int, j: int, fits: int) -> str:
    """Excerpt j of `size` characters of document `name` (whole lines; `fits` excerpts of it fit end to end,
    the 4 or fewer taken are spread over them) and a question about it."""
    start, end = cut(text, size, j, fits)
    excerpt = text[start:end]
    rng = random.Random(f"{name}:{size}:{j}")
    names = DEF.findall(excerpt)
    question = rng.choice(QUESTIONS).format(name=rng.choice(names)) if names else GENERAL
    return f"Here is part of Python's standard library ({name}):\n\n```python\n{excerpt}\n```\n\n{question}"
