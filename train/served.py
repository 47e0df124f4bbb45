"""Which rounds of k drafts a draft of each kind serves, from what its training made: torch-free, so that the
recipe's schema can check eval.k before anything loads (recipes/schema.py), and read by the loop, `eyas eval`,
`eyas serve` and `eyas export`. It moves into each kind's own home with issue 62's kind folders.

    kind     trained k's (DraftConfig.trained_k)           served
    eagle3   1 .. train.ttt_steps                          any k (past its TTT steps a chain reuses the head)
    peagle   1 .. train.ttt_steps (its depths)             the trained ones: k <= ttt_steps
    dflash   train.ttt_steps (whole blocks; with           the trained ones: k = block_size - 1, or any k up
             train.block_lengths random 1 .. ttt_steps)    to it with random block lengths
"""

from __future__ import annotations

from eyas.errors import InputError


def trained_k(kind: str, tr) -> list[int]:
    """The rounds of k drafts that training with the train section `tr` makes for a `kind` draft."""
    if kind == "dflash" and tr.block_lengths == "full":
        return [tr.ttt_steps]
    return list(range(1, tr.ttt_steps + 1))


def untrained_k(kind: str, trained: list[int] | None, k: int) -> str | None:
    """Why a round of `k` drafts is a shape a `kind` draft that trained rounds of `trained` drafts did not
    train (one line, for a refusal), or None where it did, where its kind serves any k (EAGLE-3), or where
    `trained` is None (not recorded: a draft imported from another trainer's layout)."""
    if trained is None or kind == "eagle3" or k in trained:
        return None
    t = max(trained)
    if kind == "peagle":
        why = f"this P-EAGLE draft trained {t} depths (train.ttt_steps={t}); a depth past them is untrained"
        return f"k={k}: {why}: serve k <= {t}"
    if len(trained) == 1:
        return (
            f"k={k}: this DFlash draft trained whole blocks of {t + 1} only (train.block_lengths: full); a "
            f"shorter block's slots see fewer mask slots than in training: serve k = {t}, or train it with "
            "train.block_lengths: random"
        )
    return f"k={k}: this DFlash draft trained blocks of up to {t + 1}: serve k <= {t}"


def default_k(kind: str, trained: list[int] | None, k: int = 3) -> int:
    """`k`, or the trained k nearest to it where the kind serves only what it trained (a DFlash block's)."""
    if trained is None or untrained_k(kind, trained, k) is None:
        return k
    return min(trained, key=lambda t: (abs(t - k), t))


def refuse_untrained(cfg, k: int, where: str) -> None:
    """Before a target loads (eval, `eyas serve`): an InputError naming `where` (the draft's flag and path)
    if a round of `k` drafts is one the DraftConfig `cfg`'s draft did not train (untrained_k)."""
    why = untrained_k(cfg.kind, cfg.trained_k, k)
    if why:
        raise InputError(f"{where}: {why}")
