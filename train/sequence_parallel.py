"""Sequence parallelism: one packed row spread over P processes (Ulysses for TTT and P-EAGLE; DFlash
gathers the row's context, below).

A row of T tokens (padded to a multiple of P) is cut into P contiguous shards; rank r of a group owns
indices [r*n, (r+1)*n), n = T / P. Everything per token (fc, norms, qkv, MLP, lm_head, loss) runs on the
shard alone; for TTT only attention crosses ranks, and it does as DeepSpeed-Ulysses does it:

    rank r: q (B, n, nh, d), k, v (B, n, nkv, d)            its tokens, every head
        │ all-to-all (deepspeed.sequence.layer.DistributedAttention)
        ▼
    rank r: q (B, T, nh/P, d), k, v (B, T, nkv/P, d)        every token, its heads
        │ ttt_attention (train/attention.py) over the whole row: the step-0 prefix (causal, per document)
        │ and each index's own chain (steps 1..j: local to the index, so any shard holds them whole)
        ▼ all-to-all back
    rank r: o (B, n, nh, d)

Keys and values are kept per TTT step in the gathered layout (every token, this rank's heads), so step j
sends only its own q, k, v. TTT reads the target and the text ahead of an index: step j at index i
embeds x_{i+1+j} and is scored against z_{i+1+j} and x_{i+2+j}. So a rank holds the row's token ids, loss
mask and document ids whole (B x T integers), and the teacher (final states or top-k) on its shard plus a
halo of ttt_steps + 1 positions of the next shard; the aux states on its shard only (`window`).

Losses and metrics weigh tokens as one process does: each step's loss is this rank's sum over its shard
divided by the count over the whole row (an all-reduce of a scalar per step); the per-step counts are
summed over the group, so every rank's TTTOutput describes the whole row; run_length is gathered whole
(validation replays the loop over whole answers).

Gradients: the parameters are replicated (DDP) or sharded (FSDP2, ZeRO) over all P x D processes, which
average gradients over all of them; the row's gradient is the SUM of its P shards' gradients (each shard's
loss is a part of the row's loss, and the all-to-all's backward carries the attention's cross-shard terms),
so each rank scales its loss by P before backward: the average over P x D is then the sum over the group,
averaged over the D groups, as D processes of whole rows would get.

The mesh: P x D processes, groups of P consecutive ranks (torch DeviceMesh ("dp", "sp")); the D groups are
dealt different micro-batches (train/schedule.py with world D, rank = the group's index).

DFlash (train/kinds/dflash) crosses ranks once, not per layer: its blocks sit at random anchors (a varying
number per shard) and each attends to the whole row's context before its anchor, so a rank gathers the
row's normed context (B, T, H) (`all_tokens`, an all-gather whose backward sums each shard's gradient over
the group) and runs its own shard's blocks against it: every layer projects the whole context to keys and
values on every rank (the context parallelism of an all-gather of keys / values, Llama 3's; the aux
states, fc and norm, the blocks and the loss stay on the shard). P need not divide the heads there, and
DeepSpeed is not needed. A rank runs the blocks of the anchors in its shard: where a row's answer lies in
one shard (a long prompt, then its answer), that rank runs all of the row's blocks (`eyas plan` prices a
GPU for them all).

Why not accelerate's `ParallelismConfig(sp_size=...)`: its DeepSpeed backend (ALST) patches the attention
of a transformers model (`UlyssesSPAttentionHF`) and shards each batch with no halo; the draft is not a
transformers model, its attention is TTT's, and TTT's step j reads j + 2 positions past a shard. Its
`cp_size` (torch's context parallel) rings standard causal SDPA calls only. DeepSpeed's
`DistributedAttention` wraps any local attention: that part is used as it ships.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from eyas.recipes.schema import RecipeError

STATE_KEYS = ("aux",)  # per-token states a rank needs on its shard only
TEACHER_KEYS = ("final", "teacher_ids", "teacher_logprobs")  # ... on its shard plus the halo
ROW_KEYS = ("input_ids", "loss_mask", "doc_ids")  # kept whole on every rank


@dataclass
class SequenceParallel:
    """This process's place in the P x D mesh. size: P; rank: its index in its group; group: the group's
    process group; dp_size, dp_rank: D and the group's index (which micro-batches it trains on); halo:
    positions of the next shard the teacher is kept for (ttt_steps + 1)."""

    size: int
    rank: int
    group: dist.ProcessGroup
    dp_size: int
    dp_rank: int
    halo: int

    @staticmethod
    def build(size: int, ttt_steps: int, device_type: str, ulysses: bool = True) -> SequenceParallel:
        """The mesh over every process of the launch, groups of `size` consecutive ranks (a collective:
        every process calls it); `ulysses`: the kind's attention crosses ranks through DeepSpeed's
        all-to-all (`attend`; DFlash's `all_tokens` needs no DeepSpeed)."""

        world = dist.get_world_size() if dist.is_initialized() else 1
        if world % size:
            raise RecipeError(
                f"train.sequence_parallel={size} does not divide the {world} training processes: launch a "
                "multiple of it"
            )
        mesh = init_device_mesh(device_type, (world // size, size), mesh_dim_names=("dp", "sp"))
        if ulysses:
            _init_deepspeed_comm()
        return SequenceParallel(
            size=size,
            rank=mesh.get_local_rank("sp"),
            group=mesh.get_group("sp"),
            dp_size=world // size,
            dp_rank=mesh.get_local_rank("dp"),
            halo=ttt_steps + 1,
        )

    def bounds(self, T: int) -> tuple[int, int, int]:
        """Row length T (a multiple of P) -> this rank's shard: (start, end, end of the teacher's window)."""
        n = T // self.size
        lo, hi = self.rank * n, (self.rank + 1) * n
        return lo, hi, min(T, hi + self.halo)

    def window(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A collated batch (whole rows) -> what this rank keeps: the rows padded to a multiple of P (padding:
        loss mask 0, a document of its own), ROW_KEYS whole, the aux states on the shard, the teacher on the
        shard and its halo."""
        batch = pad_rows(batch, self.size)
        lo, hi, ext = self.bounds(batch["input_ids"].shape[1])
        out = {}
        for key, x in batch.items():
            if key in STATE_KEYS:
                x = x[:, lo:hi]
            elif key in TEACHER_KEYS:
                x = x[:, lo:ext]
            out[key] = x
        return out

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over the group (no gradient through it)."""
        x = x.detach().clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=self.group)
        return x

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n, ...) shards -> (B, T, ...) the whole row (no gradient)."""
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=1)

    def all_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n, ...) shards -> (B, T, ...) the whole row, with the gradient: backward sums each shard's part
        over the group (DFlash's context)."""
        return _AllTokens.apply(x, self)

    def attend(self, local):
        """local(q, k, v) over every token and this rank's heads ((B, h, T, d), train/attention.py's layout)
        -> attend(q, k, v) over this rank's tokens and every head ((B, h, n, d)), through DeepSpeed's
        all-to-all (its autograd function sends the gradients back the same way)."""
        from deepspeed.sequence.layer import DistributedAttention

        def seq_major(q, k, v):  # DistributedAttention's layout is (B, tokens, heads, d)
            o = local(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            return o.transpose(1, 2)

        ulysses = DistributedAttention(seq_major, self.group, scatter_idx=2, gather_idx=1)

        def attend(q, k, v):
            return ulysses(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0).transpose(1, 2)

        return attend


class _AllTokens(torch.autograd.Function):
    """An all-gather along the tokens whose backward gives each rank the group's summed gradient of its own
    shard (an all-reduce, then its slice). Why not torch.distributed.nn.functional.all_gather: on gloo its
    backward scatters from each group rank as if it were a global rank, which fails in every group but the
    first (P x D processes, D > 1; torch 2.13)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
        ctx.sp, ctx.n = sp, x.shape[1]
        parts = [torch.empty_like(x) for _ in range(sp.size)]
        dist.all_gather(parts, x.contiguous(), group=sp.group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.clone(memory_format=torch.contiguous_format)  # autograd's buffer: not ours to sum into
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.sp.group)
        lo = ctx.sp.rank * ctx.n
        return grad[:, lo : lo + ctx.n], None


def check_heads(size: int, num_attention_heads: int, num_key_value_heads: int) -> None:
    """Ulysses gives each rank whole heads: P must divide the draft's query and key/value heads."""
    if size > 1 and (num_attention_heads % size or num_key_value_heads % size):
        raise RecipeError(
            f"train.sequence_parallel={size} must divide the draft's attention heads "
            f"(draft.num_attention_heads={num_attention_heads}, "
            f"draft.num_key_value_heads={num_key_value_heads}): each process attends over whole heads"
        )


def pad_rows(batch: dict[str, torch.Tensor], multiple: int) -> dict[str, torch.Tensor]:
    """Right-pad every per-token tensor of a collated batch to a length that `multiple` divides: zeros, the
    loss mask 0, the document id of a row's last position plus one (padding: a document of its own, last)."""
    T = batch["input_ids"].shape[1]
    extra = -T % multiple
    if not extra:
        return batch
    out = {}
    for key, x in batch.items():
        if key == "lengths":
            out[key] = x
            continue
        pad = x.new_zeros((x.shape[0], extra, *x.shape[2:]))
        if key == "doc_ids":
            pad += x[:, -1:] + 1
        out[key] = torch.cat([x, pad], dim=1)
    return out


def _init_deepspeed_comm() -> None:
    """DeepSpeed's all-to-all runs through deepspeed.comm, which wraps the process group already made
    (accelerate's); under a DeepSpeed launch accelerate has done this."""
    try:
        import deepspeed.comm
    except ImportError:
        raise RecipeError(
            "train.sequence_parallel: its all-to-all attention is DeepSpeed's DistributedAttention, and "
            "DeepSpeed is not installed: DS_BUILD_OPS=0 pip install --no-build-isolation 'deepspeed>=0.17' "
            "(eyas's train extra)"
        ) from None

    if not deepspeed.comm.is_initialized():
        deepspeed.comm.init_distributed(dist_backend=dist.get_backend(), dist_init_required=False)
