"""Draft kinds: one folder a kind, one registry line here, one interface (`DraftKind`, train/kinds/base.py).

    kind     its home              model, training unroll (core.py)          a round in the loop
    eagle3   train/kinds/eagle3/   Eagle3Draft, ttt_forward (train/model.py, a chain / tree of draft forwards
                                   train/ttt.py: the base the others use)
    peagle   train/kinds/peagle/   PEagleDraft, cod_forward                  K drafts from one forward
    dflash   train/kinds/dflash/   DFlashDraft, dflash_forward               a block of drafts, one forward

The recipe picks one with `draft.kind`; a checkpoint's config says its own (DraftConfig.kind). The trainer,
the loop, export, import, the plan and the schema read a kind through `kind_of(config)` / `kind_named(name)`
and its faces, never by its name. What the kinds' unrolls share (grids, row seeds) is train/grids.py.
This package and each kind's `__init__.py` are torch-free (the schema reads them); a kind's `core.py` is not.
"""

from __future__ import annotations

import json
from pathlib import Path

from eyas.infra.errors import InputError

from .base import DraftKind
from .config import DEFAULT_KIND, DraftConfig
from .dflash import DFLASH
from .eagle3 import EAGLE3
from .peagle import PEAGLE

KINDS: dict[str, DraftKind] = {k.name: k for k in (EAGLE3, PEAGLE, DFLASH)}
if DEFAULT_KIND not in KINDS:  # DraftConfig's default kind (config.py) is a registered one
    raise ImportError(f"train/kinds/config.py DEFAULT_KIND {DEFAULT_KIND!r} is no registered kind")
if any(DraftConfig.classes.get(n) is not k.config_class for n, k in KINDS.items()):  # each its own class
    raise ImportError(
        "a kind's config_class is not the DraftConfig class of its kind (train/kinds/*/config.py)"
    )


def kind_named(name: str) -> DraftKind:
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown draft kind {name!r} (expected one of {', '.join(KINDS)})") from None


def kind_of(cfg) -> DraftKind:
    """The kind of a DraftConfig (or anything with a `kind`)."""
    return kind_named(cfg.kind)


def published_kind(raw: dict) -> DraftKind:
    """The kind of a published draft from its config.json `raw` (an EAGLE-3 draft unless another kind reads
    it as its own)."""
    # the kinds with a layout of their own first (DFlash's reads no other kind's), EAGLE-3 last: a P-EAGLE
    # config is EAGLE-3's with a mask token, which a third party's DFlash config may carry too
    own = sorted(
        (k for k in KINDS.values() if k is not EAGLE3), key=lambda k: k.formats[0] == EAGLE3.formats[0]
    )
    return next((k for k in own if k.published(raw)), EAGLE3)


def speculative_config(draft: str | Path | None, k: int) -> dict | None:
    """vLLM's --speculative-config for an exported draft (None: no speculation), as its kind has vLLM serve it
    (DraftKind.vllm_config; the kind read from the export's config.json, published_kind): a DFlash block of
    k + 1 slots, P-EAGLE's k drafts from one forward (`parallel_drafting`), EAGLE-3's chain."""
    if draft is None:
        return None
    config = Path(draft) / "config.json"
    raw = json.loads(config.read_text()) if config.is_file() else {}
    return published_kind(raw).vllm_config(str(draft), k)


def make_draft(cfg):
    """The draft module of cfg.kind, initialised (under `torch.device("meta")`: shapes only)."""
    return kind_of(cfg).model(cfg)


def foreign_options(recipe, check) -> None:
    """Refuse a recipe option that a kind other than `draft.kind` owns (DraftKind.own_options), set away from
    its default."""
    kind = recipe.draft.kind
    owned = sorted({o for k in KINDS.values() for o in k.own_options})
    for option in owned:
        owners = [k.name for k in KINDS.values() if option in k.own_options]
        section, key = option.split(".")
        part = getattr(recipe, section)
        value, default = getattr(part, key), type(part).model_fields[key].default
        if kind in owners or value == default:
            continue
        names = " or ".join(KINDS[o].summary.split(":")[0] for o in owners)
        shown = str(value).lower() if isinstance(value, bool) else value
        left = "null" if default is None else str(default).lower() if isinstance(default, bool) else default
        why = (
            f"{shown} is a {names} draft's option: set draft.kind: {' or '.join(owners)}, or leave it {left}"
        )
        check(False, option, why)


def default_k(cfg_kind: str, trained: list[int] | None, k: int = 3) -> int:
    """`k`, or the trained k nearest to it where the kind serves only what it trained (a DFlash block's)."""
    if trained is None or kind_named(cfg_kind).untrained_k(trained, k) is None:
        return k
    return min(trained, key=lambda t: (abs(t - k), t))


def refuse_untrained(cfg, k: int, where: str) -> None:
    """Before a target loads (eval, `eyas serve`): an InputError naming `where` (the draft's flag and path)
    if a round of `k` drafts is one the DraftConfig `cfg`'s draft did not train (DraftKind.untrained_k)."""
    why = kind_of(cfg).untrained_k(cfg.trained_k, k)
    if why:
        raise InputError(f"{where}: {why}")
