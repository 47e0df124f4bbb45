"""The `capture` stage: run the target over the regenerated sequences and store its hidden states.

Per token the draft trains on the target's aux states (inputs of decoder layers
`aux_layer_ids`, vLLM convention: id k = HF hidden_states[k]) and its final state (the
input of lm_head, after the final norm). They are read with forward hooks
(`data.target.tapped`), not `output_hidden_states`, so only the requested layers are kept.

Before anything is stored, a forward of the first batch's first sequences, cut short (`check_final`:
full logits are (B, T, V)), checks that `lm_head(final)` reproduces the target's logits: if the hooks
saw anything else (logit soft-capping or scaling after the lm_head, a model that never calls its
lm_head module…) the draft would learn the wrong thing, so the stage stops loudly.

Sequences are processed shortest first in fixed batches and packed into shards of about
`capture.shard_tokens` tokens (format in data/shards.py). `index.json` is rewritten after
each shard; a re-run keeps the listed shards and continues with the next sequence.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from eyas.data.compact import check_block_width, encode_aux, topk_teacher
from eyas.data.regenerate import capture_order, loss_mask, read_sequences
from eyas.data.sharding import Shard, Slices, current_shard, target_for_rank
from eyas.data.shards import INDEX, ShardBuffer, shard_name, write_shard
from eyas.data.target import (
    LAYER_ID_CONVENTION,
    StopForward,
    input_device,
    load_head_weights,
    load_recipe_target,
    load_target_config,
    refuse_vllm_mxfp4,
    tapped,
    text_config,
)
from eyas.infra.interrupts import held
from eyas.infra.io import read_json, write_json
from eyas.infra.layout import is_done, mark_done, read_done, require_done, stage_dir
from eyas.infra.vllm.vllm_env import require_vllm
from eyas.recipes.load import check_against_target
from eyas.recipes.schema import CaptureSection, Recipe, TargetSection

STAGE = "capture"
HF_FIX = (
    "set capture.backend: vllm (vLLM's replicas, the vllm section; it runs MXFP4 weights as they are stored)"
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def right_padded(sequences: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id sequences (lists or 1-D tensors) -> input_ids, attention_mask (B, T_max), right padded."""
    T = max(len(x) for x in sequences)
    ids = torch.zeros((len(sequences), T), dtype=torch.long)
    mask = torch.zeros((len(sequences), T), dtype=torch.long)
    for b, x in enumerate(sequences):
        ids[b, : len(x)], mask[b, : len(x)] = torch.as_tensor(x), 1
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
        raise RuntimeError(
            f"{model.name_or_path}: the lm_head hook saw "
            f"{None if final is None else tuple(final.shape)} for input of shape "
            f"{tuple(input_ids.shape)}; the model does not apply its output embedding module "
            "to every position"
        )
    return tap.aux, final, logits


def verify_final(
    model,
    final: torch.Tensor,
    logits: torch.Tensor,
    attention_mask: torch.Tensor,
    tolerance: float,
    target: str,
) -> float:
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
            "lm_head?), so a draft trained on it would be wrong."
        )
    return rel


# the lm_head check's forward: the first VERIFY_SEQUENCES sequences of a process's capture, VERIFY_TOKENS
# tokens of each. Full logits are (B, T, V) and the check holds four of them in fp32: on the capture's first
# batch they took 24 GB for 16 sequences of ~2,200 tokens of a 49K vocab (gpt-oss: 201K).
VERIFY_SEQUENCES, VERIFY_TOKENS = 4, 128


def check_final(model, tap, seqs: list[dict], tolerance: float, target: str) -> float:
    """verify_final on a forward of the first VERIFY_SEQUENCES of `seqs`, cut to VERIFY_TOKENS each, with the
    full logits; `tap` stops later forwards at the lm_head input. -> verify_final's relative difference."""
    ids, mask = right_padded([s["input_ids"][:VERIFY_TOKENS] for s in seqs[:VERIFY_SEQUENCES]])  # (B, T)
    dev = input_device(model)
    ids, mask = ids.to(dev), mask.to(dev)
    tap.stop_at_final = False
    _, final, logits = capture_batch(model, tap, ids, mask)
    # verify_final's own lm_head call goes through the tap too: stopping starts after it
    rel = verify_final(model, final, logits, mask, tolerance, target)
    tap.stop_at_final = True
    return rel


# header keys added after the first captures, with the value an index without them means
LATER_KEYS = {
    "aux_format": "same",
    "teacher": "final",
    "teacher_topk": None,
    "mode": "offline",
    "backend": "hf",
}


def _check_resumable(index: dict, expected: dict, out_dir: Path) -> None:
    for key, value in expected.items():
        if index.get(key, LATER_KEYS.get(key)) != value:
            raise RuntimeError(
                f"{out_dir / INDEX}: a partial capture with {key}={index.get(key)!r}, but "
                f"this run has {key}={value!r}; delete {out_dir} to capture from scratch"
            )


def _online(
    recipe: Recipe,
    run_dir: Path,
    model,
    layer_ids: list[int],
    header: dict,
    first: list[dict],
    seqs: list[dict],
    t0: float,
) -> dict:
    """`capture.mode: online`: with the HF backend (train/online.py) check the target on the first batch as
    an offline capture does; write an index with no shards. Training runs the target itself, or asks vLLM's
    producers for the states (capture.backend: vllm, train/online_vllm.py; vLLM returns no logits to
    check)."""
    verified = None
    if model is not None:
        with tapped(model, layer_ids) as tap:
            verified = check_final(model, tap, first, recipe.capture.verify_tolerance, recipe.target.model)
    num_tokens = sum(len(s["input_ids"]) for s in seqs)
    write_json(
        stage_dir(run_dir, STAGE) / INDEX,
        {
            **header,
            "mode": "online",
            "shards": [],
            "num_sequences": len(seqs),
            "num_tokens": num_tokens,
            "bytes_per_token": 0,
        },
    )
    where = "inside training" if model is not None else "in vLLM's producers during training"
    print(f"capture: online: the target runs {where} for {num_tokens} tokens; nothing stored")
    stats = {
        "mode": "online",
        "num_sequences": len(seqs),
        "num_tokens": num_tokens,
        "num_shards": 0,
        "bytes_per_token": 0,
        "aux_layer_ids": layer_ids,
        "lm_head_max_rel_diff": verified,
        "wall_s": round(time.time() - t0, 3),
    }
    mark_done(run_dir, STAGE, stats)
    return stats


def run_capture(
    recipe: Recipe, run_dir: str | Path, progress: bool = True, shard: str | Shard | None = None
) -> dict:
    """The `capture` stage (needs the `regenerate` stage); this process's `shard` of it (data/sharding.py):
    a contiguous run of the length-ordered batches holding about 1/N of the tokens, so the joined shards
    list the sequences in the single-process order."""
    if is_done(run_dir, STAGE):
        return read_done(run_dir, STAGE)
    require_done(run_dir, "regenerate", STAGE)
    t0 = time.time()
    shard = current_shard(shard)
    c, t = recipe.capture, target_for_rank(recipe.target, shard)
    slices = Slices(
        Path(run_dir), STAGE, shard, "index", complete=lambda x: x["num_sequences"] == x["expected_sequences"]
    )
    if c.mode == "online" and shard.index > 0:  # nothing to share out: shard 0 checks the target
        return slices.wait_or_leave("shard 0 checks the target and writes the online index")
    if c.backend == "vllm":
        model, layer_ids, header, lm_head = None, *_vllm_target(recipe, t)
    else:
        model, layer_ids, header, lm_head = _load_target(recipe, t)
    seqs = read_sequences(run_dir)
    order = capture_order(seqs)
    if c.mode == "online":
        first = [seqs[i] for i in order[: c.batch_size]]
        return _online(recipe, run_dir, model, layer_ids, header, first, seqs, t0)
    batches = [[seqs[i] for i in order[j : j + c.batch_size]] for j in range(0, len(order), c.batch_size)]
    first, end = shard.contiguous([sum(len(s["input_ids"]) for s in b) for b in batches])
    mine = batches[first:end]
    lengths = [len(s["input_ids"]) for b in mine for s in b]
    # a shard is written once it holds capture.shard_tokens: at most that, less one, + the longest sequence
    capacity = min(c.shard_tokens - 1 + max(lengths, default=1), sum(lengths))
    out = _Output(slices, header, [first, end], sum(len(b) for b in mine), ShardBuffer(max(capacity, 1)))
    bar = tqdm(
        total=sum(len(s["input_ids"]) for b in mine for s in b),
        initial=out.num_tokens,
        desc="capture" + (f" {shard}" if out.label else ""),
        unit="tok",
        unit_scale=True,
        disable=not progress,
    )
    if c.backend == "vllm":
        new_tokens, fwd_s = _capture_batches_vllm(recipe, t, layer_ids, lm_head, mine, out, bar, out.label)
    else:
        new_tokens, fwd_s = _capture_batches(model, layer_ids, lm_head, c, t.model, mine, out, bar)
    bar.close()
    out.rate = new_tokens / fwd_s if fwd_s > 0 else out.rate
    index = out.commit()  # the last rows, and the index with this run's speed
    if out.label:
        print(f"capture: shard {shard}: {index['num_tokens']} tokens in {len(out.shards)} shards")
    return slices.finish(
        lambda: _stage_record(slices, out, index, c, t0),
        {"num_tokens": index["num_tokens"], "tokens_per_s": out.rate},
    )


def _load_target(recipe: Recipe, t: TargetSection) -> tuple:
    """The target of `t` (the recipe's target section for this rank), checked against the recipe.

    -> model, aux layer ids, the index header, the lm_head weight (V, H) for the top-k teacher."""
    model, _ = load_recipe_target(t, fix=HF_FIX)
    cfg = text_config(model.config)
    layer_ids = check_against_target(recipe, cfg.num_hidden_layers, cfg.vocab_size)
    header = _header(recipe.capture, t, cfg, layer_ids)
    lm_head = model.get_output_embeddings().weight  # (V, H): the top-k teacher's logits
    if recipe.capture.teacher == "topk" and lm_head.device.type == "meta":  # offloaded: read from disk
        lm_head = load_head_weights(t.model, t.trust_remote_code)["lm_head"]
    return model, layer_ids, header, lm_head


def _vllm_target(recipe: Recipe, t: TargetSection) -> tuple:
    """What `capture.backend: vllm` needs of the target without loading it here (vLLM does):
    its config, checked against the recipe. -> aux layer ids, the index header, the lm_head weight."""

    require_vllm("capture.backend: vllm")  # before anything is written
    refuse_vllm_mxfp4(t, "capture.backend")
    cfg = text_config(load_target_config(t.model, t.trust_remote_code))
    layer_ids = check_against_target(recipe, cfg.num_hidden_layers, cfg.vocab_size)
    lm_head = (
        load_head_weights(t.model, t.trust_remote_code)["lm_head"]
        if recipe.capture.teacher == "topk"
        else None
    )
    return layer_ids, _header(recipe.capture, t, cfg, layer_ids), lm_head


def _header(c: CaptureSection, t: TargetSection, cfg, layer_ids: list[int]) -> dict:
    """The index header: what every shard of this capture holds (a resumed capture must match it)."""
    header = {
        "target": t.model,
        "aux_layer_ids": layer_ids,
        "layer_id_convention": LAYER_ID_CONVENTION,
        "hidden_size": cfg.hidden_size,
        "dtype": c.dtype,
        "aux_format": c.aux_format,
        "teacher": c.teacher,
        "teacher_topk": c.teacher_topk if c.teacher == "topk" else None,
        "mode": c.mode,
        "backend": c.backend,
    }
    check_block_width(c.aux_format, cfg.hidden_size)
    return header


class _Output:
    """What this process captures: its shards as they are written, and its index, rewritten after each shard
    (index.json; a slice's index-rIofN.json also keeps its batches, its lm_head check and its speed)."""

    def __init__(self, slices: Slices, header: dict, batches: list[int], expected: int, buffer: ShardBuffer):
        self.out_dir = stage_dir(slices.run_dir, STAGE)
        self.label = slices.shard.label if slices.shard.count > 1 else None
        self.path = slices.record() if self.label else self.out_dir / INDEX
        self.header = header
        self.extra = {"batches": batches, "expected_sequences": expected} if self.label else {}
        self.buffer = buffer  # the rows of the next shard
        self._resume(slices)

    def _resume(self, slices: Slices) -> None:
        """Take up what an earlier process of this slice left: the shards its index lists are kept (with its
        lm_head check and speed), the rest (temporaries, shards written after the last index) is deleted."""
        _check_layout(slices)
        label, batches = self.label, self.extra.get("batches")
        slices.remove_strays([f".shard-{label}-*.tmp", f".{self.path.name}.*.tmp"] if label else [".*.tmp"])
        before = read_json(self.path) if self.path.is_file() else {}
        if before:
            _check_resumable(before, self.header, self.out_dir)
            if label and before.get("batches") != batches:
                raise RuntimeError(
                    f"{self.path}: this slice was batches {before.get('batches')} when it was "
                    f"written and is batches {batches} now (capture.batch_size or the "
                    f"sequences changed); delete {self.out_dir} to capture from scratch"
                )
        self.shards: list[dict] = before.get("shards", [])
        written = {s["file"] for s in self.shards}  # a shard not listed was written, but the crash came first
        slices.remove_strays(
            [f"shard-{label}-*.safetensors" if label else "shard-[0-9]*.safetensors"], keep=written
        )
        self.verified = before.get("lm_head_max_rel_diff")  # a resumed process checks its first batch again
        self.rate = before.get("tokens_per_s")
        self.save()

    @property
    def num_sequences(self) -> int:
        return sum(s["num_sequences"] for s in self.shards)

    @property
    def num_tokens(self) -> int:
        return sum(s["num_tokens"] for s in self.shards)

    def save(self) -> dict:
        """Rewrite the index (a slice's also keeps its check and speed). -> the index."""
        more = {"lm_head_max_rel_diff": self.verified, "tokens_per_s": self.rate} if self.label else {}
        index = {**index_over(self.header, self.shards), **self.extra, **more}
        write_json(self.path, index)
        return index

    def add(self, row: dict[str, torch.Tensor], shard_tokens: int) -> None:
        """One sequence's tensors (copied); once `shard_tokens` are buffered they are written as the next
        shard."""
        self.buffer.add(row)
        if self.buffer.tokens >= shard_tokens:
            self.commit()

    def commit(self) -> dict:
        """The buffered rows as the next shard and the index listing it, as one step: a SIGINT / SIGTERM
        that arrives in between is delivered after both, so the complete shard is kept. -> the index."""
        with held():
            self._write_buffer()
            return self.save()

    def _write_buffer(self) -> None:
        if self.buffer.tokens:
            path = self.out_dir / shard_name(len(self.shards), self.label)
            self.shards.append(write_shard(path, self.buffer.packed(), self.buffer.lengths))
            self.buffer.clear()


def _capture_batches(
    model,
    layer_ids: list[int],
    lm_head: torch.Tensor,
    c: CaptureSection,
    target: str,
    batches: list[list[dict]],
    out: _Output,
    bar,
) -> tuple[int, float]:
    """This slice's `batches` of sequences through the target, from the first sequence `out` does not hold
    yet, into `out`'s shards. -> (new tokens, forward seconds)."""
    done = out.num_sequences
    dev = input_device(model)  # where input ids go (the embedding's execution device)
    new_tokens, fwd_s = 0, 0.0
    with tapped(model, layer_ids) as tap:
        if done // c.batch_size < len(batches):  # once per process, on its first batch; then no lm_head
            out.verified = check_final(model, tap, batches[done // c.batch_size], c.verify_tolerance, target)
        for j in range(done // c.batch_size, len(batches)):
            batch = batches[j]
            ids, mask = right_padded([s["input_ids"] for s in batch])  # (B, T)
            ids, mask = ids.to(dev), mask.to(dev)
            tf = time.time()
            aux, final, _ = capture_batch(model, tap, ids, mask)
            stored = stored_form(aux, final, c, len(layer_ids), lm_head)  # (B, T, ...)
            fwd_s += time.time() - tf
            new_tokens += _add_batch(out, batch, j * c.batch_size, done, [stored] * len(batch), c, bar)
    return new_tokens, fwd_s


def _capture_batches_vllm(
    recipe: Recipe, t: TargetSection, layer_ids, lm_head, batches: list[list[dict]], out: _Output, bar, label
) -> tuple[int, float]:
    """As _capture_batches, the states coming from vLLM's forward (data/capture_vllm.py): a worker per
    replica of the recipe's `vllm` section, each on its own batches, the batches stored in their order."""
    from eyas.data.capture_vllm import StateSplit, replicas_for  # lazy: httpx

    c = recipe.capture
    split = StateSplit(t, layer_ids)
    done, new_tokens = out.num_sequences, 0
    todo = batches[done // c.batch_size :]
    longest = max((len(s["input_ids"]) for b in todo for s in b), default=1)
    with replicas_for(recipe, split.ids, longest, out.out_dir, label) as vllm:
        t_start = time.time()  # the replicas are up: from here on, capture's speed
        for j, states in vllm.in_order([[s["input_ids"] for s in b] for b in todo]):
            j += done // c.batch_size
            stored = [stored_form(*split(x), c, len(layer_ids), lm_head) for x in states]
            new_tokens += _add_batch(out, batches[j], j * c.batch_size, done, stored, c, bar, per_row=True)
    return new_tokens, time.time() - t_start


def _add_batch(
    out: _Output, batch, first: int, done: int, stored, c: CaptureSection, bar, per_row=False
) -> int:
    """The batch's rows not yet in a shard (sequence `first` + b >= `done`) into `out`. `stored`: per row
    its stored form, (B, T, ...) of the whole batch, or (1, T, ...) of the row alone (per_row).
    -> tokens added."""
    added = 0
    for b, s in enumerate(batch):
        if first + b < done:  # already in a shard (resumed mid-batch)
            continue
        L = len(s["input_ids"])
        row = {n: x[0 if per_row else b, :L] for n, x in stored[b].items()}  # views: out.add copies them
        row.update(input_ids=torch.tensor(s["input_ids"]), loss_mask=torch.tensor(loss_mask(s)))
        out.add(row, c.shard_tokens)
        added += L
        bar.update(L)
    return added


def stored_form(
    aux: torch.Tensor, final: torch.Tensor, c: CaptureSection, n_aux: int, lm_head: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Per token the aux states in their stored form and the teacher (final state or top-k).

    aux (B, T, n_aux*H), final (B, T, H), lm_head (V, H) -> {name: (B, T, ...) on the CPU}."""
    B, T = final.shape[:2]
    dtype = DTYPES[c.dtype]
    stored = encode_aux(aux.reshape(B * T, -1), n_aux, c.aux_format, dtype)
    if c.teacher == "final":
        stored["final"] = final.reshape(B * T, -1).to(dtype)
    else:
        stored.update(topk_teacher(final.reshape(B * T, -1), lm_head, c.teacher_topk))
    return {n: x.cpu().view(B, T, *x.shape[1:]) for n, x in stored.items()}


def _stage_record(slices: Slices, out: _Output, index: dict, c: CaptureSection, t0: float) -> dict:
    """Join the slices (index.json over every slice's shards, in slice order), say what was stored and mark
    the stage done. `index`: this process's final index. -> the stage record."""
    shards, verified, rate = out.shards, out.verified, out.rate
    if out.label:
        parts = slices.records()
        shards = [s for p in parts for s in p["shards"]]
        index = save_joined(out.out_dir, out.header, shards)
        verified = max((v for p in parts if (v := p.get("lm_head_max_rel_diff")) is not None), default=None)
        rate = sum(p.get("tokens_per_s") or 0 for p in parts) or None
    layer_ids, bpt = out.header["aux_layer_ids"], index["bytes_per_token"]
    aux_as = c.aux_format if c.aux_format != "same" else c.dtype
    teacher = "final state in " + c.dtype if c.teacher == "final" else f"top-{c.teacher_topk}"
    print(
        f"capture: {index['num_tokens']} tokens in {len(shards)} shards, {bpt:.1f} bytes/token "
        f"(aux {len(layer_ids)}x{out.header['hidden_size']} as {aux_as}, teacher: {teacher}, ids, mask)"
    )
    stats = {
        "num_sequences": index["num_sequences"],
        "num_tokens": index["num_tokens"],
        "num_shards": len(shards),
        "bytes_per_token": bpt,
        "aux_layer_ids": layer_ids,
        "lm_head_max_rel_diff": verified,
        "tokens_per_s": rate,
        "wall_s": round(time.time() - t0, 3),
    }
    if out.label:
        stats["capture_shards"] = slices.shard.count
    known = {f"{STAGE}/{s['file']}": s for s in shards}  # checksummed when written
    mark_done(slices.run_dir, STAGE, stats, known=known)
    return stats


def index_over(header: dict, shards: list[dict]) -> dict:
    """An index listing `shards` (their entries from write_shard), with the totals."""
    num_tokens = sum(s["num_tokens"] for s in shards)
    return {
        **header,
        "shards": shards,
        "num_sequences": sum(s["num_sequences"] for s in shards),
        "num_tokens": num_tokens,
        "bytes_per_token": sum(s["bytes"] for s in shards) / num_tokens if num_tokens else None,
    }


def save_joined(out_dir: Path, header: dict, shards: list[dict]) -> dict:
    """index.json over the slices' shards, in slice order (= the single-process order)."""
    index = index_over(header, shards)
    write_json(out_dir / INDEX, index)
    return index


def _check_layout(slices: Slices) -> None:
    """A partial capture is resumed only with the same number of slices it was started with."""
    shard, out_dir = slices.shard, slices.out_dir
    sliced = slices.on_disk()
    counts = {int(f.stem.split("of")[1]) for f in sliced}
    if shard.count == 1 and sliced:
        raise RuntimeError(
            f"{sliced[0]}: a capture sharded {counts.pop()} ways is partial here; finish it "
            f"with `eyas capture --shard I/N` (or the same launcher), or delete {out_dir}"
        )
    joined = read_json(out_dir / INDEX)["shards"] if (out_dir / INDEX).is_file() else []
    ours = all(s["file"].startswith("shard-r") and f"of{shard.count}-" in s["file"] for s in joined)  # a join
    others = counts - {shard.count}
    if shard.count > 1 and (others or not ours):  # (an index.json of this slicing: redo the join)
        was = f"sharded {sorted(others)} ways" if others else "in one process"
        raise RuntimeError(
            f"{out_dir}: a partial capture made {was} cannot be resumed as shard {shard}; "
            f"resume it the way it was started, or delete {out_dir}"
        )
