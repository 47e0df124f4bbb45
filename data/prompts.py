"""Prompts: reading chat data sets in their common layouts, and the `prompts` stage.

`load_conversations` turns a local .jsonl/.json file or a hub dataset into a list of
conversations, each a list of {"role", "content"} messages (roles system/user/assistant).
Recognised record layouts, tried in this order:

- OpenAI:     {"messages": [{"role", "content"}, ...]}
- ShareGPT:   {"conversations": [{"from": "human"/"gpt"/"system"/..., "value"}, ...]}
- UltraChat:  {"messages" or "data": ["user turn", "assistant turn", ...]}  (alternating strings)
- bare:       {"prompt"}, {"question"}, {"instruction", "input"?}, MT-bench {"turns": [first, ...]}

The `prompts` stage keeps, per conversation, what the target will be asked to answer
(an optional system message and the FIRST user turn; the target regenerates the answer),
dedupes, shuffles with `data.seed`, and holds out `data.num_eval_prompts` prompts for
evaluation that are never trained on:

    RUN/prompts/train.jsonl   {"id": str, "messages": [...]} per line
    RUN/prompts/eval.jsonl    same layout, held out
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from eyas.data.target import resolve_path
from eyas.io import is_done, mark_done, read_done, read_jsonl, stage_dir, write_jsonl
from eyas.recipes.schema import Recipe, RecipeError

STAGE = "prompts"

# Speaker names seen in the wild -> chat roles.
ROLES = {
    "system": "system",
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "model": "assistant",
}


class DataFormatError(ValueError):
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
            raise DataFormatError(f"{where}: message {j} has an unknown role {speaker!r} "
                                  f"(known: {', '.join(sorted(ROLES))})")
        if not isinstance(content, str):
            raise DataFormatError(f"{where}: message {j} content must be a string, got {type(content).__name__}")
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
        conv = [{"role": "user", "content": rec["turns"][0]}]
    else:
        raise DataFormatError(
            f"{where}: no conversation found (expected one of the fields messages, conversations, data, "
            f"prompt, question, instruction, turns; got {', '.join(sorted(rec)) or 'no fields'})")
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
        lists = [k for k, v in obj.items() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)]
        if len(lists) == 1:
            return obj[lists[0]]
        raise DataFormatError(f"{path}: expected an array of records or an object with one list of records, "
                              f"found {len(lists)} such lists ({', '.join(lists) or 'none'})")
    raise DataFormatError(f"{path}: expected an array or object, got {type(obj).__name__}")


def _nonblank_lines(path: Path) -> list[int]:
    """Line numbers of the non-blank lines: record i of read_jsonl(path) is on line [i]."""
    with open(path) as f:
        return [n for n, line in enumerate(f, 1) if line.strip()]


def _convert(records: Iterable, where: Callable[[int], str]) -> list[list[dict]]:
    return [record_to_conversation(r, where(i)) for i, r in enumerate(records)]


def load_conversations(source: str, split: str = "train", hub_config: str | None = None) -> list[list[dict]]:
    """All conversations of a local .jsonl/.json file or a hub dataset ("org/name").

    -> one list of {"role", "content"} messages per record. A malformed JSON line fails with
    the file and line number, a record without a usable user turn with the file and its
    line (.jsonl) or record number (.json, hub)."""
    path = Path(source)
    if path.is_file():
        if path.suffix == ".jsonl":
            rows = read_jsonl(path)
            lines = _nonblank_lines(path)
            return _convert(rows, lambda i: f"{path}:{lines[i]}")
        if path.suffix == ".json":
            return _convert(_json_records(path), lambda i: f"{path}: record {i}")
        raise DataFormatError(f"{path}: unsupported file type {path.suffix!r} (expected .jsonl or .json)")
    if path.suffix in (".jsonl", ".json") or path.exists():
        raise FileNotFoundError(f"prompt file {source} does not exist (or is not a regular file)")
    import datasets

    ds = datasets.load_dataset(source, hub_config, split=split)
    return _convert(ds, lambda i: f"{source} (config {hub_config}, split {split}): record {i}")


def prompt_messages(conv: list[dict], system_prompt: str | None = None) -> list[dict]:
    """What the target is asked to answer: a system message (`system_prompt` if given, else the
    conversation's own first system message, if any) and the FIRST user turn. Any answer that
    follows is dropped: the target regenerates it."""
    system = system_prompt
    if system is None:
        system = next((m["content"] for m in conv if m["role"] == "system"), None)
    user = next(m for m in conv if m["role"] == "user" and m["content"].strip())
    return ([{"role": "system", "content": system}] if system is not None else []) + [dict(user)]


def read_prompts(run_dir: str | Path, split: str) -> list[dict]:
    """The `prompts` stage's output: split is "train" or "eval". -> [{"id", "messages"}]."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    return read_jsonl(Path(run_dir) / STAGE / f"{split}.jsonl")


def run_prompts(recipe: Recipe, run_dir: str | Path, progress: bool = True) -> dict:
    """The `prompts` stage: load, reduce to prompts, dedupe, shuffle, split train/eval.

    Ids are the record's index in the source, so a prompt can be traced back to it."""
    if is_done(run_dir, STAGE):
        return read_done(run_dir, STAGE)
    t0 = time.time()
    d = recipe.data
    source = resolve_path(d.prompts)
    convs = load_conversations(source, d.split, d.hub_config)
    seen: set[str] = set()
    unique = []
    for i, conv in enumerate(convs):
        msgs = prompt_messages(conv, d.system_prompt)
        key = json.dumps(msgs, sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append({"id": str(i), "messages": msgs})
    random.Random(d.seed).shuffle(unique)
    chosen = unique[:d.num_prompts] if d.num_prompts is not None else unique
    if d.num_eval_prompts >= len(chosen):
        raise RecipeError(f"data.num_eval_prompts: holding out {d.num_eval_prompts} eval prompts leaves no "
                          f"training prompts out of {len(chosen)} (source {source}, data.num_prompts="
                          f"{d.num_prompts}, {len(convs) - len(unique)} duplicates dropped)")
    evals, train = chosen[:d.num_eval_prompts], chosen[d.num_eval_prompts:]
    out = stage_dir(run_dir, STAGE)
    write_jsonl(out / "eval.jsonl", evals)
    write_jsonl(out / "train.jsonl", train)
    stats = {"source": source, "num_records": len(convs), "num_duplicates": len(convs) - len(unique),
             "num_train": len(train), "num_eval": len(evals), "wall_s": round(time.time() - t0, 3)}
    if progress:
        print(f"prompts: {len(train)} train, {len(evals)} eval from {len(convs)} records of {source} "
              f"({stats['num_duplicates']} duplicates)")
    mark_done(run_dir, STAGE, stats)
    return stats
