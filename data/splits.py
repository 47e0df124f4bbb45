"""The three splits every number comes from, and which stage reads which.

    train    the training conversations' captured sequences, less the tuning ones      (train)
    tuning   whole training conversations held out (`train.val_fraction` of them, seeded by
             `train.val_seed`, else `train.seed`): training's validation, checkpoint choice
             (`train.keep_best`), the vocab leaves them out, and every default or sweep is chosen on
             them (benchmarks/bench_defaults.py, bench_anchors.py --split tuning); in the serving loop,
             their first prompts (`eyas eval --split tuning`)
    test     prompts nothing was tuned on: the recipe's eval benchmarks (MT-bench, HumanEval, GSM8K test)
             or, without any, the prompts stage's held-out slice (RUN/prompts/eval.jsonl) - the only
             split a table in a recipe comment, the docs or the README reports (`eyas eval`, the default)

A conversation is held out whole: a later turn's prompt carries the earlier turns and the target's answers
to them, so a split by sequence would train on text the tuning split then scores. For the same reason the
built-in long prompts of one document are held out together (their excerpts overlap: data/long_text.py;
the prompts stage records the document as the prompt's "group").
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from eyas.data.prompts import prompt_messages, read_prompts
from eyas.data.regenerate import conversations_in_capture_order

SPLITS = ("train", "tuning", "test")
TUNE_ON = ("tuning",)  # where a script may choose between settings


def split_validation(groups: list[str], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """groups: the conversation of each sequence -> (train indices, held-out indices), disjoint, whole
    conversations on one side: `fraction` of the distinct conversations, from a seeded permutation of
    them in sorted order. fraction > 0 holds out at least one conversation and always leaves one."""
    convs = sorted(set(groups))
    if fraction <= 0 or len(convs) < 2:
        return list(range(len(groups))), []
    n_val = min(len(convs) - 1, max(1, round(fraction * len(convs))))
    perm = torch.randperm(len(convs), generator=torch.Generator().manual_seed(seed * 7919 + 1)).tolist()
    held = {convs[i] for i in perm[:n_val]}
    return [i for i, g in enumerate(groups) if g not in held], [i for i, g in enumerate(groups) if g in held]


def split_seed(tr) -> int:
    """The seed of the recipe's held-out split (`train` section `tr`): `train.val_seed` when set (seeds
    compared on the same held-out conversations), else `train.seed`."""
    return tr.seed if tr.val_seed is None else tr.val_seed


def held_out_split(tr, groups: list[str]) -> tuple[list[int], list[int]]:
    """The recipe's split of sequences whose conversations are `groups`: (train, tuning) indices."""
    return split_validation(groups, tr.val_fraction, split_seed(tr))


def tuning_conversations(tr, groups: list[str]) -> set[str]:
    """The conversations the recipe's split (`train` section `tr`) holds out for tuning."""
    return {groups[i] for i in held_out_split(tr, groups)[1]}


def split_record(tr, groups: list[str]) -> dict:
    """What a stage that depends on the split records of it, so a later stage can check it uses the same:
    its settings, and which conversations it holds out (a digest of their sorted ids)."""
    held = tuning_conversations(tr, groups)
    return {
        "val_fraction": float(tr.val_fraction),
        "split_seed": split_seed(tr),
        "num_tuning_conversations": len(held),
        "tuning_digest": hashlib.sha256("\n".join(sorted(held)).encode()).hexdigest()[:16],
    }


def same_split(recorded: dict, ours: dict) -> bool:
    """Whether a stage's recorded split is `ours` (a record written before the digest: on what it holds)."""
    return all(ours.get(k) == v for k, v in recorded.items())


def run_groups(run_dir: str | Path, num_sequences: int) -> list[str]:
    """The conversation of each of the run's `num_sequences` training sequences, in capture order."""
    groups = conversations_in_capture_order(run_dir)
    if len(groups) != num_sequences:
        raise RuntimeError(
            f"{run_dir}: the regenerate stage holds {len(groups)} sequences, the training data "
            f"{num_sequences}: re-run capture (delete {Path(run_dir) / 'capture'}) from this regeneration"
        )
    return groups


def tuning_prompts(recipe, run_dir: str | Path) -> list[list[dict]]:
    """The tuning split as the serving loop's prompts: each held-out conversation's first prompt (system
    message and first user turn), in prompt order, less any that a training conversation also starts with."""
    held = tuning_conversations(recipe.train, conversations_in_capture_order(run_dir))
    system = recipe.data.system_prompt
    prompts = read_prompts(run_dir, "train")
    firsts = {p["id"]: prompt_messages(p["messages"], system) for p in prompts}
    group = {p["id"]: p.get("group") or p["id"] for p in prompts}  # what the split holds out whole
    trained = {str(m) for pid, m in firsts.items() if group[pid] not in held}
    return [m for pid, m in firsts.items() if group[pid] in held and str(m) not in trained]
