"""`eyas export`: write an eyas checkpoint in a published layout, checked and re-read.

    eyas export RUN_OR_CKPT --format {eagle3,speculators} --out DIR
                [--num-speculative-tokens 3] [--dtype bfloat16] [--include-embeddings]
                [--engines vllm,sglang,trtllm] [--target TARGET]

Order of work (nothing is written under DIR unless every step passes):
  1. the draft itself: vocab map valid, SiLU MLP (the eyas layer);
  2. against the target, when its config is readable: aux layer ids within its layer count
     (vLLM numbering: id k = input of decoder layer k, so 1 <= k < N), hidden and vocab sizes;
     when the target is a local directory, the draft's embedding equals the target's;
  3. per engine (serve/interchange/engines.py): refused with the engine's reason;
  4. tensors and config.json written to a temporary directory next to DIR (serve/interchange/formats.py);
  5. re-read by the importer and run on a fixed batch: the logits (and d2t/t2d, and every config
     field) must equal those of the source checkpoint with its weights rounded to the export
     dtype — bit for bit, in fp32; then the directory is renamed into place.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from eyas.data.target import (
    DEMO_TARGET,
    FULL_WIDTH_TARGET,
    load_head_weights,
    load_target_config,
    resolve_path,
    text_config,
)
from eyas.infra import io
from eyas.infra.errors import InputError, as_input
from eyas.infra.layout import resolve_checkpoint
from eyas.train.checkpoint import load_draft
from eyas.train.kinds import default_k, kind_of
from eyas.train.kinds.config import DraftConfig
from eyas.train.model import Eagle3Draft

from . import engines as engine_rules
from .formats import FORMATS, check_vocab_map, parse_dtype, plan_tensors
from .importer import load_published

# Files an export directory may hold; anything else under --out is never replaced.
EXPORT_FILES = {"config.json", "model.safetensors", "README.md", "eyas_report.json", "recipe.yaml"}


class ExportError(InputError, ValueError):
    """An export refused or failed its check; the message says why."""


@dataclass
class ExportResult:
    path: Path
    fmt: str
    engines: tuple[str, ...]
    dtype: torch.dtype
    num_speculative_tokens: int
    include_embeddings: bool
    config: DraftConfig
    target: str | None
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- checks


def check_draft(draft: Eagle3Draft) -> None:
    """What the eyas layer is, whatever the engine: SwiGLU with SiLU, a one-to-one vocab map."""
    cfg = draft.config
    if cfg.hidden_act != "silu":
        raise ExportError(f"hidden_act {cfg.hidden_act!r}: the eyas MLP is SwiGLU with SiLU")
    try:
        check_vocab_map(draft.d2t, draft.t2d, cfg.draft_vocab_size, cfg.vocab_size, "checkpoint")
    except ValueError as e:
        raise ExportError(str(e)) from None


def _local_target_dir(target: str) -> Path | None:
    if target in (DEMO_TARGET, FULL_WIDTH_TARGET) or target.startswith(DEMO_TARGET + "/"):
        return Path(resolve_path(target))
    return Path(target) if Path(target).is_dir() else None


def read_target_config(target: str | None, notes: list[str]):
    """The target's text config, or None (with a note) when it cannot be read here."""
    if not target:
        notes.append("no target recorded; aux layer ids and sizes not checked against it")
        return None

    if _local_target_dir(target) is not None:
        return text_config(load_target_config(target))
    try:
        return text_config(load_target_config(target))
    except OSError as e:
        notes.append(
            f"config of target {target} not readable ({e.__class__.__name__}); aux layer ids and "
            "sizes not checked against it"
        )
        return None


def check_against_target(cfg: DraftConfig, tcfg) -> None:
    n_layers = tcfg.num_hidden_layers
    bad = [k for k in cfg.aux_layer_ids if not 0 <= k <= n_layers]
    if bad:
        raise ExportError(
            f"aux_layer_ids {cfg.aux_layer_ids}: {bad} out of range for a target with {n_layers} "
            "layers (vLLM convention: id k = input of decoder layer k, id N = output of the last "
            "layer before the final norm: 0 <= k <= N)"
        )
    if cfg.target_hidden_size != tcfg.hidden_size:
        raise ExportError(
            f"target_hidden_size {cfg.target_hidden_size} != the target's hidden_size "
            f"{tcfg.hidden_size} (fc takes {len(cfg.aux_layer_ids)} target states)"
        )
    if cfg.vocab_size != tcfg.vocab_size:
        raise ExportError(f"vocab_size {cfg.vocab_size} != the target's vocab_size {tcfg.vocab_size}")


def check_embedding(draft: Eagle3Draft, target: str | None, dtype: torch.dtype, notes: list[str]) -> None:
    """Engines run the draft with the target's embedding: the checkpoint's copy must equal it."""
    local = _local_target_dir(target) if target else None
    if local is None:
        notes.append("embed_tokens not compared with the target's (the target is not a local directory)")
        return

    embed = load_head_weights(str(local))["embed"]
    mine = draft.embed_tokens.weight.detach()
    if tuple(embed.shape) != tuple(mine.shape):
        raise ExportError(f"embed_tokens shape {tuple(mine.shape)} != the target's {tuple(embed.shape)}")
    if not torch.equal(mine.to(dtype), embed.to(dtype)):
        diff = (mine.float() - embed.float()).abs().max().item()
        raise ExportError(
            f"embed_tokens differs from the embedding of target {target} (max |diff| {diff:.3g}); "
            "the draft must use the target's own embedding (engines substitute it)"
        )


def engine_check(
    cfg: DraftConfig, selected: tuple[str, ...], include_embeddings: bool, tcfg, notes: list[str]
) -> None:
    target_type = getattr(tcfg, "model_type", None) if tcfg is not None else None
    target_layers = tcfg.num_hidden_layers if tcfg is not None else None
    types = list(getattr(tcfg, "layer_types", None) or []) if tcfg is not None else []
    refused = [
        f"{engine_rules.ENGINE_LABELS[e]}: {p}"
        for e in selected
        for p in engine_rules.problems(cfg, e, include_embeddings, target_type, target_layers, types)
    ]
    if refused:
        raise ExportError(
            "refused for " + "; ".join(refused) + " (narrow --engines to export for the other engines)"
        )
    if tcfg is None and "sglang" in selected:
        notes.append(
            "target config unknown: whether SGLang can capture the last aux layer id was not checked"
        )
    for e in selected:
        notes.extend(engine_rules.notes(cfg, e, target_layers))


# ---------------------------------------------------------------------------- validation


def fixed_batch_outputs(draft: Eagle3Draft) -> list[torch.Tensor]:
    """Logits of a fixed random batch (a 5-token prefix on random aux states) through a round as the draft's
    kind drafts it (`fixed_round`: a chained step, P-EAGLE's mask slots, DFlash's block). Deterministic for a
    given config."""
    cfg = draft.config
    g = torch.Generator().manual_seed(0)
    B, T = 2, 5
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    aux = torch.randn(B, T, cfg.fc_in_features, generator=g)
    pos = torch.arange(T).expand(B, T)
    return draft.fixed_round(ids, aux, pos)  # as its kind drafts a round


def round_to(draft: Eagle3Draft, dtype: torch.dtype) -> None:
    """Round every floating parameter through `dtype` in place (what the export file holds)."""
    with torch.no_grad():
        for p in draft.parameters():
            p.copy_(p.to(dtype).to(p.dtype))


def verify_export(path: Path, draft: Eagle3Draft) -> None:
    """Re-read `path` with the importer; it must equal `draft` (already rounded to the export dtype)."""
    own = draft.config.own_embedding  # its own table: the file's is read back and compared
    imported, _, _ = load_published(path, embed=None if own else draft.embed_tokens.weight.detach())
    if own and not torch.equal(imported.embed_tokens.weight, draft.embed_tokens.weight):
        raise ExportError("export check failed: re-read embed_tokens differs from the draft's own")
    mine, theirs = draft.config, imported.config
    for f in dataclasses.fields(mine):  # its kind's fields (kind is one of them: theirs is the same class)
        # own_embedding says where eyas's table came from; no format writes it (the table is compared above);
        # nor trained_k (the model card gives train.ttt_steps; the refusal ran before the export)
        if f.name in ("target_model", "own_embedding", "trained_k"):
            continue
        if getattr(mine, f.name) != getattr(theirs, f.name):
            raise ExportError(
                f"export check failed: re-read {f.name} = {getattr(theirs, f.name)!r}, "
                f"the checkpoint has {getattr(mine, f.name)!r}"
            )
    for name in ("d2t", "t2d"):
        if not torch.equal(getattr(draft, name), getattr(imported, name)):
            raise ExportError(f"export check failed: re-read {name} differs from the checkpoint's")
    for step, (a, b) in enumerate(zip(fixed_batch_outputs(draft), fixed_batch_outputs(imported))):
        if not torch.equal(a, b):
            raise ExportError(
                f"export check failed: step {step} logits of the re-read export differ from the "
                f"checkpoint's (max |diff| {(a - b).abs().max().item():.3g})"
            )


# ---------------------------------------------------------------------------- writing


def _verifier(cfg: DraftConfig, target: str | None, tcfg, notes: list[str]) -> tuple[str, list[str]]:
    if not target:
        raise ExportError(
            "the speculators format names the verifier (target) model, and the checkpoint records "
            "none; pass --target"
        )
    if _local_target_dir(target) is not None:
        notes.append(
            f"verifier recorded as {target}, a local path: `vllm serve` of this export only works "
            "where that path exists"
        )
    architectures = list(getattr(tcfg, "architectures", None) or []) if tcfg is not None else []
    if not architectures:
        notes.append("verifier architectures unknown (target config not readable); written as []")
    return target, architectures


def _write(
    tmp: Path, draft: Eagle3Draft, fmt: str, dtype: torch.dtype, include_embeddings: bool, config: dict
) -> None:
    state = draft.state_dict()
    tensors = {
        p.name: state[p.source].detach().to(p.dtype).reshape(p.shape).contiguous()
        for p in plan_tensors(draft.config, fmt, dtype, include_embeddings)
    }
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def config_json(cfg: DraftConfig, fmt: str, dtype, num_speculative_tokens: int, target, tcfg, notes) -> dict:
    """The config.json of layout `fmt`, as the draft's kind writes it (DraftKind.published_config); the
    speculators layout names the target (its verifier)."""
    verifier = _verifier(cfg, target, tcfg, notes) if fmt == "speculators" else None
    return kind_of(cfg).published_config(cfg, fmt, dtype, num_speculative_tokens, verifier)


def _check_replaceable(out_dir: Path) -> None:
    """Never replace a directory holding files an export does not write."""
    if out_dir.exists():
        other = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else [out_dir.name]
        if not out_dir.is_dir() or set(other) - EXPORT_FILES:
            raise ExportError(
                f"refusing to replace {out_dir}: it holds files an export does not write ({other})"
            )


def served_k(cfg: DraftConfig, fmt: str, k: int | None) -> int:
    """The k an export of `cfg`'s draft in layout `fmt` serves: `k`, or its kind's default (a DFlash draft's
    trained block); ExportError for a layout its kind is not published in or a round it did not train."""
    kind = kind_of(cfg)
    if fmt not in kind.formats:
        raise ExportError(
            f"a {cfg.kind} draft is published in the {' or '.join(kind.formats)} layout, not {fmt}"
        )
    k = default_k(cfg.kind, cfg.trained_k) if k is None else k
    untrained = kind.untrained_k(cfg.trained_k, k)
    if untrained:
        raise ExportError(f"--num-speculative-tokens {untrained}")
    return k


def export(
    src: str | Path,
    fmt: str,
    out_dir: str | Path,
    *,
    dtype: str | torch.dtype = "bfloat16",
    num_speculative_tokens: int | None = None,
    include_embeddings: bool | None = None,
    engines: tuple[str, ...] | list[str] | None = None,
    target: str | None = None,
) -> ExportResult:
    """Export the checkpoint of a run (or a checkpoint directory) to `out_dir` in layout `fmt`.

    `engines` (default: every engine that loads `fmt` and serves the draft's kind) are the engines it is
    checked for; `target` overrides the checkpoint's recorded target (e.g. a local copy of it).
    `num_speculative_tokens` (default 3, or the nearest k the draft trained where its kind serves only those:
    a DFlash draft's block) must be a round it trained there (DraftKind.untrained_k).
    `include_embeddings` (default: speculators yes, eagle3 no): write embed_tokens.weight. The
    speculators library's loader (transformers 5, meta-device init) leaves a missing embed_tokens as
    uninitialised memory (it fills the verifier's only where the table holds a NaN), so that format
    carries the target's embedding by default; vLLM, SGLang and TRT-LLM share the target's anyway."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    dtype = parse_dtype(dtype) if isinstance(dtype, str) else dtype
    if num_speculative_tokens is not None and num_speculative_tokens < 1:
        raise ExportError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
    selected = tuple(engines) if engines else None
    unsupported = [e for e in selected or () if e not in engine_rules.FORMAT_ENGINES[fmt]]
    if unsupported:
        raise ExportError(
            f"engines {unsupported} do not load the {fmt} format "
            f"(it is loaded by {', '.join(engine_rules.FORMAT_ENGINES[fmt])})"
        )

    checkpoint = resolve_checkpoint(src)
    draft = load_draft(checkpoint, dtype=torch.float32).eval()
    cfg = draft.config
    num_speculative_tokens = served_k(cfg, fmt, num_speculative_tokens)
    if include_embeddings is None:  # a draft's own (trained) embedding always goes with it
        include_embeddings = fmt == "speculators" or cfg.own_embedding
    if cfg.own_embedding and not include_embeddings:
        raise ExportError(
            "the draft's embed_tokens is its own (trained), not the target's: export it with it"
        )
    # default: every engine that loads the format and serves the draft's kind
    serving = kind_of(cfg).engines
    selected = selected or tuple(e for e in engine_rules.FORMAT_ENGINES[fmt] if e in serving)
    target = target or cfg.target_model
    notes: list[str] = []
    check_draft(draft)
    tcfg = read_target_config(target, notes)
    if tcfg is not None:
        check_against_target(cfg, tcfg)
    engine_check(cfg, selected, include_embeddings, tcfg, notes)
    if target and not cfg.own_embedding:
        check_embedding(draft, target, dtype, notes)
    config = config_json(cfg, fmt, dtype, num_speculative_tokens, target, tcfg, notes)

    out_dir = Path(out_dir)
    _check_replaceable(out_dir)
    with io.atomic_dir(out_dir) as tmp:  # nothing lands under out_dir unless the re-read matches
        _write(tmp, draft, fmt, dtype, include_embeddings, config)
        round_to(draft, dtype)
        verify_export(tmp, draft)
    return ExportResult(
        path=out_dir,
        fmt=fmt,
        engines=selected,
        dtype=dtype,
        num_speculative_tokens=num_speculative_tokens,
        include_embeddings=include_embeddings,
        config=cfg,
        target=target,
        notes=notes,
    )


def main_export(argv: list[str] | None = None) -> int:
    """`eyas export RUN_OR_CKPT --format {eagle3,speculators} --out DIR [...]`."""
    parser = argparse.ArgumentParser(
        prog="eyas export",
        description="Write an eyas draft in a published "
        "EAGLE-3 layout, checked for the serving engines and re-read.",
    )
    parser.add_argument("src", help="run directory (uses RUN/train/checkpoint-final) or eyas checkpoint")
    parser.add_argument(
        "--format",
        required=True,
        choices=FORMATS,
        dest="fmt",
        help="eagle3 / speculators (EAGLE-3, P-EAGLE drafts); dflash / speculators (DFlash drafts)",
    )
    parser.add_argument("--out", required=True, help="directory to write")
    parser.add_argument(
        "--num-speculative-tokens",
        type=int,
        help="k: the model card's serving commands and the speculators format's "
        "proposal_methods[0].speculative_tokens (default 3, or a DFlash draft's trained block's k)",
    )
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument(
        "--include-embeddings",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write embed_tokens.weight, the target's (default: yes for speculators, whose "
        "library loader would leave it uninitialised; no for eagle3: engines share the "
        "target's embedding, so it is only needed when hidden sizes differ)",
    )
    parser.add_argument(
        "--engines",
        help="comma-separated engines to check for (default: all that load the "
        "format: eagle3 -> vllm,sglang,trtllm; speculators -> vllm)",
    )
    parser.add_argument(
        "--target", help="target model (directory or hub id); default: the one the checkpoint records"
    )
    args = parser.parse_args(argv)
    engines = tuple(e.strip() for e in args.engines.split(",") if e.strip()) if args.engines else None
    try:
        result = export(
            args.src,
            args.fmt,
            args.out,
            dtype=args.dtype,
            num_speculative_tokens=args.num_speculative_tokens,
            include_embeddings=args.include_embeddings,
            engines=engines,
            target=args.target,
        )
    except (ValueError, OSError) as e:
        raise as_input(e) from e
    for note in result.notes:
        print(f"eyas export: note: {note}", file=sys.stderr)
    print(result.path)
    return 0
