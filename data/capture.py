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
from eyas.data.sharding import Shard, balanced_ranges, current_shard, target_for_rank, wait_until
from eyas.data.shards import INDEX, shard_name, write_shard
from eyas.data.target import (LAYER_ID_CONVENTION, StopForward, input_device, load_head_weights,
                              load_recipe_target, tapped, text_config)
from eyas.io import read_json, write_json
from eyas.layout import is_done, mark_done, read_done, require_done, stage_dir
from eyas.recipes.schema import Recipe, check_against_target

STAGE = "capture"
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


def run_capture(recipe: Recipe, run_dir: str | Path, progress: bool = True, shard: str | Shard | None = None) -> dict:
    """The `capture` stage (needs the `regenerate` stage); this process's `shard` of it (data/sharding.py):
    a contiguous run of the length-ordered batches holding about 1/N of the tokens, so the joined shards
    list the sequences in the single-process order."""
    if is_done(run_dir, STAGE):
        return read_done(run_dir, STAGE)
    require_done(run_dir, "regenerate", STAGE)
    t0 = time.time()
    shard = current_shard(shard)
    c, t = recipe.capture, target_for_rank(recipe.target, shard)
    out_dir = stage_dir(run_dir, STAGE)
    if c.mode == "online" and shard.index > 0:  # nothing to share out: shard 0 checks the target
        return _wait_or_leave(run_dir, shard, "shard 0 checks the target and writes the online index")
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
    first, end = balanced_ranges([sum(len(seqs[i]["input_ids"]) for i in b) for b in batches],
                                 shard.count)[shard.index]
    label = shard.label if shard.count > 1 else None
    own_index = out_dir / (f"index-{label}.json" if label else INDEX)
    _check_layout(out_dir, shard)

    mine = [f".shard-{label}-*.tmp", f".{own_index.name}.*.tmp"] if label else [".*.tmp"]
    for stray in [f for pattern in mine for f in out_dir.glob(pattern)]:  # left by a killed process
        stray.unlink()
    shards: list[dict] = []
    before: dict = {}
    if own_index.is_file():
        before = read_json(own_index)
        _check_resumable(before, header, out_dir)
        if label and before.get("batches") != [first, end]:
            raise RuntimeError(f"{own_index}: this slice was batches {before.get('batches')} when it was written and "
                               f"is batches {[first, end]} now (capture.batch_size or the sequences changed); delete "
                               f"{out_dir} to capture from scratch")
        shards = before["shards"]
    listed = {s["file"] for s in shards}
    for f in out_dir.glob(f"shard-{label}-*.safetensors" if label else "shard-[0-9]*.safetensors"):
        if f.name not in listed:  # written, but the crash came before the index
            f.unlink()
    done = sum(s["num_sequences"] for s in shards)
    expected = sum(len(b) for b in batches[first:end])
    extra = {"batches": [first, end], "expected_sequences": expected} if label else {}

    def save_index(**more) -> dict:  # a slice's index also keeps its check and speed
        index = {**index_over(header, shards), **extra, **(more if label else {})}
        write_json(own_index, index)
        return index

    verified = before.get("lm_head_max_rel_diff")  # a resumed process checks its own first batch again
    rate = before.get("tokens_per_s")
    index = save_index(lm_head_max_rel_diff=verified, tokens_per_s=rate)
    total_tokens = sum(len(seqs[i]["input_ids"]) for b in batches[first:end] for i in b)
    bar = tqdm(total=total_tokens, initial=sum(s["num_tokens"] for s in shards),
               desc="capture" + (f" {shard}" if label else ""), unit="tok", unit_scale=True, disable=not progress)
    buffer: list[dict[str, torch.Tensor]] = []
    buffered = 0
    checked, new_tokens, fwd_s = False, 0, 0.0
    with tapped(model, layer_ids) as tap:
        for k in range(first + done // c.batch_size, end):
            batch = [seqs[i] for i in batches[k]]
            ids, mask = right_padded([s["input_ids"] for s in batch])  # (B, T)
            T = ids.shape[1]
            ids, mask = ids.to(dev), mask.to(dev)
            tf = time.time()
            aux, final, logits = capture_batch(model, tap, ids, mask)
            if not checked:  # this process's first batch: full logits once, to check the final state
                verified = verify_final(model, final, logits, mask, c.verify_tolerance, t.model)
                checked = tap.stop_at_final = True  # later batches skip the lm_head
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
                if (k - first) * c.batch_size + b < done:  # already in a shard (resumed mid-batch)
                    continue
                L = len(s["input_ids"])
                buffer.append({**{n: x[b, :L] for n, x in stored.items()},
                               "input_ids": torch.tensor(s["input_ids"]),
                               "loss_mask": torch.tensor(loss_mask(s))})
                buffered += L
                new_tokens += L
                bar.update(L)
                if buffered >= c.shard_tokens:
                    shards.append(write_shard(out_dir / shard_name(len(shards), label), buffer))
                    index = save_index(lm_head_max_rel_diff=verified, tokens_per_s=rate)
                    buffer, buffered = [], 0
        if buffer:
            shards.append(write_shard(out_dir / shard_name(len(shards), label), buffer))
        rate = new_tokens / fwd_s if fwd_s > 0 else rate
        index = save_index(lm_head_max_rel_diff=verified, tokens_per_s=rate)
    bar.close()
    if label:
        print(f"capture: shard {shard}: {index['num_tokens']} tokens in {len(shards)} shards")
        if not _joinable(run_dir, out_dir, shard):
            return {"shard": str(shard), "complete": False, "num_tokens": index["num_tokens"], "tokens_per_s": rate}
        if is_done(run_dir, STAGE):
            return read_done(run_dir, STAGE)
        parts = [read_json(out_dir / f"index-r{i}of{shard.count}.json") for i in range(shard.count)]
        shards = [s for p in parts for s in p["shards"]]
        index = save_joined(out_dir, header, shards)
        verified = max((v for p in parts if (v := p.get("lm_head_max_rel_diff")) is not None), default=None)
        rate = sum(p.get("tokens_per_s") or 0 for p in parts) or None

    bpt = index["bytes_per_token"]
    print(f"capture: {index['num_tokens']} tokens in {len(shards)} shards, {bpt:.1f} bytes/token "
          f"(aux {len(layer_ids)}x{cfg.hidden_size} as {c.aux_format if c.aux_format != 'same' else c.dtype}, "
          f"teacher: {'final state in ' + c.dtype if c.teacher == 'final' else f'top-{c.teacher_topk}'}, ids, mask)")
    stats = {"num_sequences": index["num_sequences"], "num_tokens": index["num_tokens"], "num_shards": len(shards),
             "bytes_per_token": bpt, "aux_layer_ids": layer_ids, "lm_head_max_rel_diff": verified,
             "tokens_per_s": rate, "wall_s": round(time.time() - t0, 3)}
    if label:
        stats["capture_shards"] = shard.count
    mark_done(run_dir, STAGE, stats, known={f"{STAGE}/{s['file']}": s for s in shards})  # checksummed when written
    return stats


def index_over(header: dict, shards: list[dict]) -> dict:
    """An index listing `shards` (their entries from write_shard), with the totals."""
    num_tokens = sum(s["num_tokens"] for s in shards)
    return {**header, "shards": shards, "num_sequences": sum(s["num_sequences"] for s in shards),
            "num_tokens": num_tokens,
            "bytes_per_token": sum(s["bytes"] for s in shards) / num_tokens if num_tokens else None}


def save_joined(out_dir: Path, header: dict, shards: list[dict]) -> dict:
    """index.json over the slices' shards, in slice order (= the single-process order)."""
    index = index_over(header, shards)
    write_json(out_dir / INDEX, index)
    return index


def _check_layout(out_dir: Path, shard: Shard) -> None:
    """A partial capture is resumed only with the same number of slices it was started with."""
    sliced = sorted(out_dir.glob("index-r*of*.json"))
    counts = {int(f.stem.split("of")[1]) for f in sliced}
    if shard.count == 1 and sliced:
        raise RuntimeError(f"{sliced[0]}: a capture sharded {counts.pop()} ways is partial here; finish it with "
                           f"`eyas capture --shard I/N` (or the same launcher), or delete {out_dir}")
    joined = read_json(out_dir / INDEX)["shards"] if (out_dir / INDEX).is_file() else []
    ours = all(s["file"].startswith("shard-r") and f"of{shard.count}-" in s["file"] for s in joined)  # a join
    if shard.count > 1 and (counts - {shard.count} or not ours):  # (an index.json of this slicing: redo the join)
        was = f"sharded {sorted(counts - {shard.count})} ways" if counts - {shard.count} else "in one process"
        raise RuntimeError(f"{out_dir}: a partial capture made {was} cannot be resumed as shard {shard}; resume it "
                           f"the way it was started, or delete {out_dir}")


def _joinable(run_dir: Path, out_dir: Path, shard: Shard) -> bool:
    """Whether this slice joins the capture now (every slice's index complete): a launched rank 0 waits for
    the others, other launched ranks wait for its DONE, a --shard process that is not the last leaves."""
    def complete(i: int) -> bool:
        f = out_dir / f"index-r{i}of{shard.count}.json"
        return f.is_file() and (x := read_json(f))["num_sequences"] == x["expected_sequences"]

    if shard.launched:
        if shard.index == 0:
            wait_until(lambda: all(complete(i) for i in range(shard.count)), "the other ranks' capture shards")
        else:
            wait_until(lambda: is_done(run_dir, STAGE), "rank 0 to join the capture")
        return True
    missing = [i for i in range(shard.count) if not complete(i)]
    if missing:
        print(f"capture: shard {shard} done; slices {missing} are not finished yet: the last to finish joins them")
        return False
    return True


def _wait_or_leave(run_dir: Path, shard: Shard, what: str) -> dict:
    """A launched rank waits for the stage's DONE (-> its record); a --shard process leaves at once."""
    if shard.launched:
        wait_until(lambda: is_done(run_dir, STAGE), what)
        return read_done(run_dir, STAGE)
    print(f"capture: shard {shard}: nothing to do ({what})")
    return {"shard": str(shard), "complete": False}
