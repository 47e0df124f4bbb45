"""eyas draft checkpoints: a directory in its kind's own layout (an EAGLE-3 or P-EAGLE draft's vLLM, SGLang
and TRT-LLM load as EAGLE-3; a DFlash draft's is z-lab's), plus eyas's own record.

    DIR/config.json        the kind's config (DraftKind.checkpoint_config) + an "eyas" block with the
                           DraftConfig (its kind's class: train/kinds/<name>/config.py)
    DIR/model.safetensors  fc.weight, the layers, norm.weight, lm_head.weight,
                           d2t (int64 offsets), t2d (bool), embed_tokens.weight (the target's)

The directory is written under a temporary name and renamed into place, so a crash never
leaves a half-written checkpoint under its final name.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eyas.data.target import LAYER_ID_CONVENTION, input_device, load_head_weights
from eyas.infra import io
from eyas.infra.errors import InputError
from eyas.train.kinds.config import DraftConfig

from .kinds import kind_of, make_draft
from .model import Eagle3Draft, Rotary


def save_draft(
    draft: Eagle3Draft,
    out_dir: str | Path,
    dtype: torch.dtype | None = None,
    include_embeddings: bool = True,
    extra: dict | None = None,
) -> Path:
    """Write `out_dir` atomically. `extra` goes into config.json's "eyas" block (run metadata)."""
    out_dir = Path(out_dir)
    dtype = dtype or next(draft.fc.parameters()).dtype
    tensors = {}
    for name, t in draft.state_dict().items():
        if name == "embed_tokens.weight" and not include_embeddings:
            continue
        t = t.detach().cpu()
        tensors[name] = t.to(dtype) if t.is_floating_point() else t
    config = kind_of(draft.config).checkpoint_config(draft.config, dtype)
    config["eyas"] = {
        "draft_config": draft.config.to_dict(),
        "layer_id_convention": LAYER_ID_CONVENTION,
        **(extra or {}),
    }
    with io.atomic_dir(out_dir) as tmp:
        save_file(
            {k: v.contiguous() for k, v in tensors.items()},
            str(tmp / "model.safetensors"),
            metadata={"format": "pt"},
        )
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def read_config(path: str | Path) -> DraftConfig:
    config = Path(path) / "config.json"
    if not config.is_file():
        raise InputError(
            f"{path}: no config.json, so not a draft checkpoint; give the directory of one "
            "(RUN/train/checkpoint-final, or an `eyas import` of a published draft)"
        )
    raw = json.loads(config.read_text())
    if "eyas" not in raw:
        raise InputError(
            f"{path}: not an eyas checkpoint (no 'eyas' block in config.json); "
            "use `eyas import` to convert a published draft"
        )
    return DraftConfig.from_dict(raw["eyas"]["draft_config"])


CHUNK_BYTES = 256 * 2**20  # a tensor of the file is read this much at a time (the embedding: 2.3 GB in fp32)


def _copy_in_slices(param: torch.Tensor, stored) -> None:
    """Copy a safetensors slice into `param` (casting to its dtype), CHUNK_BYTES of rows at a time."""
    if param.dim() == 0 or param.numel() * 4 <= CHUNK_BYTES:
        param.copy_(stored[:] if param.dim() else stored[...])
        return
    rows = max(1, CHUNK_BYTES // (4 * param[0].numel()))
    for i in range(0, param.shape[0], rows):
        param[i : i + rows].copy_(stored[i : i + rows])


def load_draft(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    embed: torch.Tensor | None = None,
) -> Eagle3Draft:
    """Load an eyas checkpoint. `embed` (vocab, H), the target's input embedding, which the draft's frozen
    embed_tokens equals: taken as it is (shared, not copied; the file's copy not read) where it has `dtype`
    and lives on `device`, else copied in; without it and without embed_tokens in the file, read from the
    target named in the config."""
    path = Path(path)
    cfg = read_config(path)
    embed = None if cfg.own_embedding else embed  # its own table: the file's
    # built without initialising (on the meta device), given storage in `dtype` on `device`, then the
    # checkpoint's tensors copied in one at a time: beside the draft, at most one tensor of the file in memory
    # (a built, initialised fp32 draft and the whole file would be 7 GB more at gpt-oss-120b's widths)
    with torch.device("meta"):
        draft = make_draft(cfg)
    shared = embed is not None and embed.dtype == dtype and embed.device == torch.device(device)
    if shared:  # no storage of its own (gpt-oss-120b's: 1.16 GB in bf16)
        draft.embed_tokens.weight = None
    draft = draft.to(dtype=dtype).to_empty(device=device)
    draft.rotary = Rotary(cfg)  # the one tensor made outside parameters and buffers (inv_freq)
    if shared:
        draft.embed_tokens.weight = torch.nn.Parameter(embed.detach(), requires_grad=False)
    own = draft.state_dict()
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
        if embed is None and "embed_tokens.weight" not in stored:
            if not cfg.target_model:
                raise ValueError(f"{path}: no embed_tokens.weight and no target_model to read it from")

            embed = load_head_weights(cfg.target_model)["embed"]
        if embed is not None and not shared:
            own["embed_tokens.weight"].copy_(embed)
        missing = sorted(own.keys() - stored - {"embed_tokens.weight"})
        unexpected = sorted(stored - own.keys())
        if missing or unexpected:
            raise ValueError(
                f"{path}: checkpoint does not match the draft (missing {missing}, unexpected {unexpected})"
            )
        for name in stored - ({"embed_tokens.weight"} if embed is not None else set()):
            _copy_in_slices(own[name], f.get_slice(name))
    return draft


def load_draft_beside(path: str | Path, model: torch.nn.Module) -> Eagle3Draft:
    """An eyas checkpoint loaded to run beside the target `model` (the serving loop, eval, `eyas serve`): in
    the target's dtype (float32 for a float16 target), where its input ids go, its embedding the target's own
    tensor where it has the draft's dtype and is not offloaded by a device_map (else the file's copy); in
    eval mode."""

    dtype = next(model.parameters()).dtype
    dtype = dtype if dtype != torch.float16 else torch.float32
    embed = model.get_input_embeddings().weight
    embed = embed if embed.device.type != "meta" and embed.dtype == dtype else None
    return load_draft(path, device=input_device(model), dtype=dtype, embed=embed).eval()
