"""The `capture` stage: run the target over the regenerated sequences and store its hidden states.

Per token the draft trains on the target's aux states (inputs of decoder layers
`aux_layer_ids`, vLLM convention: id k = HF hidden_states[k]) and its final state (the
input of lm_head, after the final norm). They are read with forward hooks
(`data.target.tapped`), not `output_hidden_states`, so only the requested layers are kept.

Before anything is stored, the first batch checks that `lm_head(final)` reproduces the
target's logits: if the hooks saw anything else (logit soft-capping or scaling after the
lm_head, a model that never calls its lm_head module…) the draft would learn the wrong
thing, so the stage stops loudly.

Sequences are processed shortest first in fixed batches and packed into shards of about
`capture.shard_tokens` tokens (format in data/shards.py). `index.json` is rewritten after
each shard; a re-run keeps the listed shards and continues with the next sequence.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from eyas.data.regenerate import loss_mask, read_sequences
from eyas.data.compact import check_block_width, encode_aux, topk_teacher
from eyas.data.shards import INDEX, read_index, shard_name, write_shard
from eyas.data.target import (StopForward, input_device, load_head_weights, load_recipe_target, tapped,
                              text_config)
from eyas.io import is_done, mark_done, read_done, require_done, stage_dir, write_json
from eyas.recipes.schema import Recipe, check_against_target

STAGE = "capture"
LAYER_ID_CONVENTION = "vLLM: id k = input of decoder layer k = HF hidden_states[k]"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def right_padded(sequences: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id sequences (lists or 1-D tensors) -> input_ids, attention_mask (B, T_max), right padded."""
    T = max(len(x) for x in sequences)
    ids = torch.zeros((len(sequences), T), dtype=torch.long)
    mask = torch.zeros((len(sequences), T), dtype=torch.long)
    for b, x in enumerate(sequences):
        ids[b, :len(x)], mask[b, :len(x)] = torch.as_tensor(x), 1
    return ids, mask


def capture_batch(model, tap, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """One forward of the target with `tap` attached.

    input_ids, attention_mask (B, T) -> aux (B, T, n_aux*H), final (B, T, H), logits (B, T, V),
    or logits None when the tap stops the forward at the lm_head input (`tap.stop_at_final`)."""
    tap.final = None
    logits = None
    with torch.no_grad():
        try:
            logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        except StopForward:
            pass
    final = tap.final
    if final is None or final.shape[:2] != input_ids.shape:
        raise RuntimeError(f"{model.name_or_path}: the lm_head hook saw "
                           f"{None if final is None else tuple(final.shape)} for input of shape "
                           f"{tuple(input_ids.shape)}; the model does not apply its output embedding module "
                           "to every position")
    return tap.aux, final, logits


def verify_final(model, final: torch.Tensor, logits: torch.Tensor, attention_mask: torch.Tensor,
                 tolerance: float, target: str) -> float:
    """max |lm_head(final) - logits| / max |logits| over real tokens; raises if above `tolerance`.

    final (B, T, H), logits (B, T, V), attention_mask (B, T)."""
    with torch.no_grad():
        ref = model.get_output_embeddings()(final).float().to(logits.device)  # (B, T, V)
    real = attention_mask.bool()
    diff = (ref - logits.float())[real].abs().max().item()
    scale = logits.float()[real].abs().max().item()
    rel = diff / max(scale, 1e-30)
    if not rel <= tolerance:
        raise RuntimeError(
            f"target {target}: lm_head(captured final state) does not reproduce the target's logits: max abs "
            f"diff {diff:.4g} = {rel:.4g} of max |logit| {scale:.4g} > capture.verify_tolerance={tolerance}. "
            "The captured final state is not what the logits come from (logit soft-capping or scaling after "
            "lm_head?), so a draft trained on it would be wrong.")
    return rel


# header keys added after the first captures, with the value an index without them means
LATER_KEYS = {"aux_format": "same", "teacher": "final", "teacher_topk": None, "mode": "offline"}


def _check_resumable(index: dict, expected: dict, out_dir: Path) -> None:
    for key, value in expected.items():
        if index.get(key, LATER_KEYS.get(key)) != value:
            raise RuntimeError(f"{out_dir / INDEX}: a partial capture with {key}={index.get(key)!r}, but this run "
                               f"has {key}={value!r}; delete {out_dir} to capture from scratch")


def _online(recipe: Recipe, run_dir: Path, model, layer_ids: list[int], header: dict, first: list[dict],
            seqs: list[dict], t0: float) -> dict:
    """`capture.mode: online` (train/online.py): check the target on the first batch as an offline capture
    does, and write an index with no shards; training runs the target itself."""
    ids, mask = right_padded([s["input_ids"] for s in first])  # (B, T)
    dev = input_device(model)
    ids, mask = ids.to(dev), mask.to(dev)
    with tapped(model, layer_ids) as tap:
        _, final, logits = capture_batch(model, tap, ids, mask)
    verified = verify_final(model, final, logits, mask, recipe.capture.verify_tolerance,
                            recipe.target.model)
    num_tokens = sum(len(s["input_ids"]) for s in seqs)
    write_json(stage_dir(run_dir, STAGE) / INDEX, {**header, "mode": "online", "shards": [], "num_sequences": len(seqs),
                                                   "num_tokens": num_tokens, "bytes_per_token": 0})
    print(f"capture: online: the target runs inside training for {num_tokens} tokens; nothing stored")
    stats = {"mode": "online", "num_sequences": len(seqs), "num_tokens": num_tokens, "num_shards": 0,
             "bytes_per_token": 0, "aux_layer_ids": layer_ids, "lm_head_max_rel_diff": verified,
             "wall_s": round(time.time() - t0, 3)}
    mark_done(run_dir, STAGE, stats)
    return stats


def run_capture(recipe: Recipe, run_dir: str | Path, progress: bool = True) -> dict:
    """The `capture` stage (needs the `regenerate` stage)."""
    if is_done(run_dir, STAGE):
        return read_done(run_dir, STAGE)
    require_done(run_dir, "regenerate", STAGE)
    t0 = time.time()
    c, t = recipe.capture, recipe.target
    out_dir = stage_dir(run_dir, STAGE)
    model, _ = load_recipe_target(t)
    cfg = text_config(model.config)
    layer_ids = check_against_target(recipe, cfg.num_hidden_layers, cfg.vocab_size)
    dtype = DTYPES[c.dtype]
    header = {"target": t.model, "aux_layer_ids": layer_ids, "layer_id_convention": LAYER_ID_CONVENTION,
              "hidden_size": cfg.hidden_size, "dtype": c.dtype, "aux_format": c.aux_format, "teacher": c.teacher,
              "teacher_topk": c.teacher_topk if c.teacher == "topk" else None, "mode": c.mode}
    check_block_width(c.aux_format, cfg.hidden_size)
    dev = input_device(model)  # where input ids go (the embedding's execution device)
    lm_head = model.get_output_embeddings().weight  # (V, H): the top-k teacher's logits
    if c.teacher == "topk" and lm_head.device.type == "meta":  # offloaded by the device_map: read it from disk
        lm_head = load_head_weights(t.model, t.trust_remote_code)["lm_head"]

    seqs = read_sequences(run_dir)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]["input_ids"]))  # stable: fixed across runs
    if c.mode == "online":
        return _online(recipe, run_dir, model, layer_ids, header, [seqs[i] for i in order[:c.batch_size]], seqs, t0)
    batches = [order[i:i + c.batch_size] for i in range(0, len(order), c.batch_size)]

    for stray in out_dir.glob(".*.tmp"):  # left by a killed process
        stray.unlink()
    shards: list[dict] = []
    if (out_dir / INDEX).is_file():
        index = read_index(out_dir)
        _check_resumable(index, header, out_dir)
        shards = index["shards"]
    listed = {s["file"] for s in shards}
    for f in out_dir.glob("shard-*.safetensors"):  # written, but the crash came before the index
        if f.name not in listed:
            f.unlink()
    done = sum(s["num_sequences"] for s in shards)

    def save_index() -> dict:
        num_tokens = sum(s["num_tokens"] for s in shards)
        index = {**header, "shards": shards, "num_sequences": sum(s["num_sequences"] for s in shards),
                 "num_tokens": num_tokens,
                 "bytes_per_token": sum(s["bytes"] for s in shards) / num_tokens if num_tokens else None}
        write_json(out_dir / INDEX, index)
        return index

    index = save_index()
    total_tokens = sum(len(s["input_ids"]) for s in seqs)
    bar = tqdm(total=total_tokens, initial=sum(s["num_tokens"] for s in shards), desc="capture", unit="tok",
               unit_scale=True, disable=not progress)
    buffer: list[dict[str, torch.Tensor]] = []
    buffered = 0
    verified = None
    new_tokens, fwd_s = 0, 0.0
    with tapped(model, layer_ids) as tap:
        for k in range(done // c.batch_size, len(batches)):
            batch = [seqs[i] for i in batches[k]]
            ids, mask = right_padded([s["input_ids"] for s in batch])  # (B, T)
            T = ids.shape[1]
            ids, mask = ids.to(dev), mask.to(dev)
            tf = time.time()
            aux, final, logits = capture_batch(model, tap, ids, mask)
            if verified is None:  # first batch: full logits once, to check the final state against them
                verified = verify_final(model, final, logits, mask, c.verify_tolerance, t.model)
                tap.stop_at_final = True  # later batches skip the lm_head
            del logits
            B = len(batch)
            # per token: the aux states in their stored form, and the teacher (final state or top-k)
            stored = encode_aux(aux.reshape(B * T, -1), len(layer_ids), c.aux_format, dtype)
            if c.teacher == "final":
                stored["final"] = final.reshape(B * T, -1).to(dtype)
            else:
                stored.update(topk_teacher(final.reshape(B * T, -1), lm_head, c.teacher_topk))
            stored = {n: x.cpu().view(B, T, *x.shape[1:]) for n, x in stored.items()}  # (B, T, ...)
            fwd_s += time.time() - tf
            for b, s in enumerate(batch):
                if k * c.batch_size + b < done:  # already in a shard (resumed mid-batch)
                    continue
                L = len(s["input_ids"])
                buffer.append({**{n: x[b, :L] for n, x in stored.items()},
                               "input_ids": torch.tensor(s["input_ids"]),
                               "loss_mask": torch.tensor(loss_mask(s))})
                buffered += L
                new_tokens += L
                bar.update(L)
                if buffered >= c.shard_tokens:
                    shards.append(write_shard(out_dir / shard_name(len(shards)), buffer))
                    index = save_index()
                    buffer, buffered = [], 0
        if buffer:
            shards.append(write_shard(out_dir / shard_name(len(shards)), buffer))
            index = save_index()
    bar.close()

    bpt = index["bytes_per_token"]
    print(f"capture: {index['num_tokens']} tokens in {len(shards)} shards, {bpt:.1f} bytes/token "
          f"(aux {len(layer_ids)}x{cfg.hidden_size} as {c.aux_format if c.aux_format != 'same' else c.dtype}, "
          f"teacher: {'final state in ' + c.dtype if c.teacher == 'final' else f'top-{c.teacher_topk}'}, ids, mask)")
    stats = {"num_sequences": index["num_sequences"], "num_tokens": index["num_tokens"], "num_shards": len(shards),
             "bytes_per_token": bpt, "aux_layer_ids": layer_ids, "lm_head_max_rel_diff": verified,
             "tokens_per_s": new_tokens / fwd_s if fwd_s > 0 else None, "wall_s": round(time.time() - t0, 3)}
    mark_done(run_dir, STAGE, stats)
    return stats
