"""Evaluation prompt sets: the run's held-out prompts, or any set given as `--prompts NAME=FILE`.

Records are read with the data stage's layouts (data/prompts.py: OpenAI, ShareGPT, UltraChat,
bare `prompt` / `question` / `instruction`, MT-bench `turns`); a record's `category` (MT-bench's
8 categories) is kept so results can be reported per category. Each prompt is what the target
is asked to answer (system message + first user turn), rendered with the target's chat template.

Without a file, a few names resolve to their hub copies:
    mt-bench    HuggingFaceH4/mt_bench_prompts (train)      80 questions, 8 categories
    humaneval   openai/openai_humaneval (test)              164 function completions
    gsm8k       openai/gsm8k, config main (test)            1319 grade-school math problems
and the long prompt sets (stdlib-long-Nk, essays-long-Nk, hotpotqa-long-Nk, ...: data/long_sets.py) to
their test split (prompts of about 1K tokens up to N K built from documents no training prompt quotes). Every
row also reports τ by prompt length (`by_length`: buckets doubling from 1K tokens).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from eyas.data.long_sets import describe, is_long_set
from eyas.data.long_sets import records as long_set_records
from eyas.infra.errors import InputError
from eyas.infra.io import read_jsonl

HUB_SETS = {
    "mt-bench": ("HuggingFaceH4/mt_bench_prompts", None, "train"),
    "humaneval": ("openai/openai_humaneval", None, "test"),
    "gsm8k": ("openai/gsm8k", "main", "test"),
}


@dataclass
class Benchmark:
    name: str
    source: str
    messages: list[list[dict]]  # per prompt: the chat messages the target answers
    categories: list[str | None]


def _records(source: str, split: str = "test") -> tuple[list, str]:
    path = Path(source)
    if is_long_set(source):  # long prompts built from documents (data/long_sets.py), `split` (test)
        return long_set_records(source, split), describe(source, split)
    if split != "test":
        raise InputError(f"benchmark {source}: only a long set (data/long_sets.py) has a {split} split here")
    if path.is_file():
        if path.suffix == ".jsonl":
            return read_jsonl(path, user_file=True), str(path)
        obj = json.loads(path.read_text())
        records = obj if isinstance(obj, list) else next(v for v in obj.values() if isinstance(v, list))
        return records, str(path)
    if source in HUB_SETS:
        import datasets

        repo, config, split = HUB_SETS[source]
        return list(datasets.load_dataset(repo, config, split=split)), f"{repo} ({split})"
    if path.suffix in (".jsonl", ".json") or path.exists():
        raise FileNotFoundError(f"prompt file {source} does not exist")
    import datasets

    return list(datasets.load_dataset(source, split="test")), source


def spread(records: list, limit: int | None) -> list:
    """`limit` records spread evenly over the set, in order (MT-bench lists its 8 categories one after
    another: 16 of its 80 questions are 2 of each); all of them without a limit."""
    if not limit or limit >= len(records):
        return records
    return [records[i * len(records) // limit] for i in range(limit)]


def load_benchmark(
    name: str, source: str, system_prompt: str | None = None, limit: int | None = None, split: str = "test"
) -> Benchmark:
    """`source`: a local .jsonl/.json file, a name in HUB_SETS, or a hub dataset (test split); a long set
    (data/long_sets.py) in its `split` (train: a tuning set where no recipe trains on the set's source)."""
    from eyas.data.prompts import prompt_messages, record_to_conversation  # lazy: torch

    records, where = _records(source, split)
    records = spread(records, limit)
    messages, categories = [], []
    for i, rec in enumerate(records):
        conv = record_to_conversation(rec, f"{where}: record {i}")
        messages.append(prompt_messages(conv, system_prompt))
        categories.append(rec.get("category") if isinstance(rec, dict) else None)
    if not messages:
        raise ValueError(f"benchmark {name}: {where} holds no prompts")
    return Benchmark(name=name, source=where, messages=messages, categories=categories)


def held_out(run_dir: str | Path, limit: int | None = None) -> Benchmark:
    """The run's held-out eval prompts (RUN/prompts/eval.jsonl), never trained on."""
    rows = read_jsonl(Path(run_dir) / "prompts" / "eval.jsonl")[: limit or None]
    return Benchmark(
        name="held-out",
        source=str(Path(run_dir) / "prompts" / "eval.jsonl"),
        messages=[r["messages"] for r in rows],
        categories=[None] * len(rows),
    )


def tuning(recipe, run_dir: str | Path, limit: int | None = None) -> Benchmark:
    """The tuning split's prompts (data/splits.py): the first prompt of each training conversation held out
    for validation, `limit` of them spread evenly. Settings are chosen here, never on the test split."""
    from eyas.data.splits import tuning_prompts  # lazy: torch

    messages = spread(tuning_prompts(recipe, run_dir), limit)
    if not messages:
        raise ValueError(f"{run_dir}: the tuning split is empty (train.val_fraction is 0)")
    return Benchmark(
        name="tuning",
        source=f"{run_dir}: the conversations held out for validation",
        messages=messages,
        categories=[None] * len(messages),
    )
