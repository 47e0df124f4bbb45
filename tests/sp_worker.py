"""Run under torchrun (gloo): one TTT forward and backward over a packed row, once whole on rank 0
(the reference, as one process trains it) and once spread over the P processes (train/sequence_parallel.py);
rank 0 writes what the two gave to OUT/NAME.json for each case: the losses, the counts, run_length, and per
parameter the largest difference of the row's gradient (each process's loss scaled by P and the gradients
averaged, as DDP does) from the reference's, next to the reference's largest entry. Several cases in one
launch: each launch spends seconds importing torch, eyas and DeepSpeed on each rank.

    python -m torch.distributed.run --nproc_per_node P tests/sp_worker.py OUT '{"NAME": [T, ["k=v", ...]]}'

key=value: draft options (norm_before_fc, norm_before_residual, norm_output: 0/1; num_layers, sliding_window),
attention, checkpoint_layer (0/1), loss (kl | lk | ce), docs (sequences packed in the row); kind=dflash: a
DFlash draft (block TTT + 1, train/kinds/dflash) with `anchors` random anchors (seeded) and `dpace` (alpha).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from eyas.train.kinds import KINDS, make_draft
from eyas.train.kinds.config import DraftConfig
from eyas.train.kinds.dflash.core import dflash_forward
from eyas.train.model import Eagle3Draft
from eyas.train.sequence_parallel import SequenceParallel
from eyas.train.ttt import target_view, ttt_forward

H, V, V_D, N_AUX, TTT = 64, 300, 120, 3, 4


def draft(opts: dict) -> Eagle3Draft:
    torch.manual_seed(0)
    # every kind's options at once, the kind's own kept (from_dict drops another kind's at null or false)
    cfg = DraftConfig.from_dict(
        dict(
            hidden_size=H,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=16,
            intermediate_size=128,
            vocab_size=V,
            draft_vocab_size=V_D,
            aux_layer_ids=[1, 2, 3],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            norm_before_fc=bool(opts.get("norm_before_fc", 0)),
            norm_before_residual=bool(opts.get("norm_before_residual", 0)),
            norm_output=bool(opts.get("norm_output", 0)),
            num_layers=int(opts.get("num_layers", 1)),
            sliding_window=int(opts.get("sliding_window", 0)) or None,
            kind=opts.get("kind", "eagle3"),
            mask_token_id=V - 1 if opts.get("kind") == "dflash" else None,
            block_size=TTT + 1 if opts.get("kind") == "dflash" else None,
        )
    )
    d = make_draft(cfg)
    for p in d.parameters():  # away from the initial zeros / ones, so every option changes the outputs
        p.data.add_(torch.randn_like(p) * 0.05)
    d2t = torch.arange(V_D) * 2 - torch.arange(V_D)  # draft id i -> target id 2i (as an offset)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[torch.arange(V_D) * 2] = True
    d.set_vocab_map(d2t, t2d)
    return d


def row(T: int, docs: int) -> dict[str, torch.Tensor]:
    """One packed row: `docs` sequences of random lengths, the last 37 positions padding; answers (loss mask
    1) on the second half of each sequence."""
    g = torch.Generator().manual_seed(1)
    used = T - 37
    cuts = sorted(torch.randperm(used - 1, generator=g)[: docs - 1].add(1).tolist())
    bounds = [0, *cuts, used]
    doc = torch.full((T,), docs, dtype=torch.int64)
    mask = torch.zeros(T)
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        doc[a:b] = i
        mask[(a + b) // 2 : b] = 1
    ids = torch.randint(0, V, (T,), generator=g)
    final = torch.randn(T, H, generator=g)
    return {
        "aux": torch.randn(1, T, N_AUX * H, generator=g),
        "input_ids": ids[None],
        "loss_mask": mask[None],
        "doc_ids": doc[None],
        "final": final[None],
    }


def run(model: Eagle3Draft, batch: dict, lm_head: torch.Tensor, opts: dict, sp=None):
    dflash = opts.get("kind") == "dflash"
    anchors = int(opts["anchors"]) if "anchors" in opts else None
    options = {"anchors": anchors, "anchor_seed": (0, 0), "dpace": float(opts.get("dpace", 0)) or None}
    out = (dflash_forward if dflash else ttt_forward)(
        model,
        batch["aux"],
        batch["input_ids"],
        batch["loss_mask"],
        batch["doc_ids"],
        target_view(batch["final"], lm_head, model),
        TTT,
        attention=opts.get("attention", "auto"),
        checkpoint_layer=bool(int(opts.get("checkpoint_layer", 0))),
        loss=opts.get("loss", "kl"),
        sp=sp,
        **(options if dflash else {}),
    )
    (out.loss * (sp.size if sp is not None else 1)).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def case(T: int, opts: dict) -> dict | None:
    """One row of T tokens with draft options `opts`, whole on rank 0 and spread -> what they gave (rank 0;
    None on the others)."""
    ulysses = KINDS[opts.get("kind", "eagle3")].sp_splits_heads  # DFlash gathers its context (no DeepSpeed)
    sp = SequenceParallel.build(dist.get_world_size(), TTT, "cpu", ulysses)
    batch = row(T, int(opts.get("docs", 5)))
    g = torch.Generator().manual_seed(2)
    lm_head = torch.randn(V, H, generator=g) * 0.3
    # the text: where the "target" argmax is, so that chains go on (run_length, conditional counts)
    batch["input_ids"][0, 1:] = target_view(batch["final"], lm_head, draft(opts)).argmax[0, :-1]

    # the reference on rank 0 alone, which reads it (it runs no collective); the others wait for rank 0 at
    # the spread run's first collective
    ref_out, ref = run(draft(opts), batch, lm_head, opts) if dist.get_rank() == 0 else (None, None)
    mine_out, mine = run(draft(opts), sp.window(batch), lm_head, opts, sp)
    for gr in mine.values():  # averaged over the processes as DDP does: each loss was scaled by P
        dist.all_reduce(gr, group=sp.group)
        gr /= sp.size
    if dist.get_rank() != 0:
        return None
    return {
        "loss": [ref_out.loss_value, mine_out.loss_value],
        "step_loss": [ref_out.step_loss, mine_out.step_loss],
        "counts": [
            [ref_out.step_count, ref_out.step_right, ref_out.step_cond_base, ref_out.step_cond_right],
            [mine_out.step_count, mine_out.step_right, mine_out.step_cond_base, mine_out.step_cond_right],
        ],
        "sampled": [ref_out.step_sampled_right, mine_out.step_sampled_right],
        "run_length_equal": torch.equal(ref_out.run_length, mine_out.run_length[:, :T]),
        "grads": {n: [float((mine[n] - ref[n]).abs().max()), float(ref[n].abs().max())] for n in sorted(ref)},
        "missing": sorted(set(ref) ^ set(mine)),
    }


def main() -> None:
    out_dir, cases = Path(sys.argv[1]), json.loads(sys.argv[2])
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    for name, (T, opts) in cases.items():
        result = case(int(T), dict(x.split("=", 1) for x in opts))
        if result is not None:
            (out_dir / f"{name}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
