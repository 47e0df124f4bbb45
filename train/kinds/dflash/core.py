"""DFlash: a block of drafts from ONE forward of a small non-causal stack (block diffusion, arXiv 2602.06036).

The draft, as vLLM 0.32's qwen3_dflash.py runs it (module and tensor names are vLLM's and z-lab's):

    aux states of the target  (B, T, n_aux * H_t)   vLLM ids: id k = input of decoder layer k
            │ fc (no bias) -> hidden_norm                      (the *context*, one per committed position)
            ▼
    ctx (B, T, H) ──┬──────────────┬─── ... every layer projects it with its own k_proj / v_proj
                    ▼              ▼        (+ k_norm, RoPE at the context's positions): keys/values only
    block  [x_n, mask, ..., mask]  (S = B slots at positions n .. n+S-1), embedded by the target's table
            │ layer l: input_layernorm -> q (q_norm, RoPE), k/v of the block itself
            │          attention over [ctx keys at positions < n ; the whole block (non-causal)]
            │          + residual; post_attention_layernorm -> SwiGLU MLP, + residual
            ▼  (num_layers Qwen3-style layers, `layers.0..`)
    norm -> lm_head -> logits (S, V_d): slot s >= 1 drafts x_{n+s}; slot 0 (the anchor x_n) drafts nothing
                                         (speculators' sample_from_anchor = false, vLLM's DFlash proposer)

One round in the loop, after the target verified up to x_{n-1} and sampled x_n: the draft's cache holds
the context keys of positions 0..n-1 (written as the target committed them), and the block above gives
S - 1 drafts at once (vLLM: num_speculative_tokens = S - 1).

Training (`dflash_forward`): anchors a = i + 1 drawn at random in each row (`train.max_anchors` per row;
validation takes every one), each anchor's block run at once against the row's context keys (only those
before the anchor, in its own packed sequence). Slot d + 1 of anchor i + 1 predicts x_{i+2+d} from the text
up to x_{i+1}: exactly TTT step d at index i (train/ttt.py), so the teacher, the loss (train.loss), its
decay over the block (decay**d, the DFlash paper's exp(-d / gamma) for decay = exp(-1 / gamma)), the counts
and the run lengths validation replays are TTT's `score_step`, on a (B, T) grid of the kept anchors.

Attention in training: a block's queries see the context keys before its anchor and its own S keys. The
blocks of a row run in chunks of anchors through SDPA with an explicit mask over [context ; the chunk's
blocks] (`chunk_of`: bounded scores on a CPU, a bounded mask on CUDA), whatever the number of anchors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from eyas.train.kinds.config import DraftConfig

from ...grids import row_seeds, shift_right, to_grid
from ...model import MLP, Eagle3Draft, KVCache, RMSNorm, add_output_head, apply_rope
from ...packing import positions_in_doc
from ...ttt import ChainState, TargetView, TTTOutput, fill_counts, score_step, teacher_rows

# query x key elements of one chunk of blocks (chunk_of): its scores a head on a CPU (fp32: 2**22 is 16 MiB a
# head), its mask on CUDA (bool: 2**28 is 256 MiB; the gpt-oss recipe's 512 blocks of 10 over 8,192 tokens
# take one chunk)
ANCHOR_KEYS = 1 << 22
MASK_ELEMENTS = 1 << 28


class DFlashAttention(nn.Module):
    """Qwen3 attention (per-head q_norm / k_norm, RoPE after the norm) whose keys / values come from two
    inputs: the context and the block."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        H, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(H, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(H, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(H, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, H, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:  # (B, L, n * d) -> (B, n, L, d)
        B, L, _ = x.shape
        return x.view(B, L, n, self.head_dim).transpose(1, 2)

    def query(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (B, L, H) -> q (B, n_heads, L, d), normed and rotated."""
        return apply_rope(self.q_norm(self._heads(self.q_proj(x), self.n_heads)), cos, sin)

    def key_value(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x (B, L, H) -> k, v (B, n_kv, L, d), k normed and rotated (as vLLM's context keys)."""
        k = apply_rope(self.k_norm(self._heads(self.k_proj(x), self.n_kv)), cos, sin)
        return k, self._heads(self.v_proj(x), self.n_kv)

    def out(self, o: torch.Tensor) -> torch.Tensor:  # (B, n_heads, L, d) -> (B, L, H)
        B, _, L, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(B, L, self.n_heads * self.head_dim))


class DFlashLayer(nn.Module):
    """One Qwen3-style decoder layer over the block, its keys / values extended by the context's."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, ctx, rope_q, rope_c, attend) -> torch.Tensor:
        """x (B, L, H) the blocks' stream (training: (1, N * S, H), every block of the batch); ctx (B, C, H)
        the rows' normed context (None: its keys are in the cache); rope_q / rope_c: (cos, sin) of their
        positions; attend(q, k, v, k_ctx, v_ctx) -> o
        (B, n_heads, L, d). Through forward: FSDP / ZeRO-3 gather the layer's weights here."""
        h = self.input_layernorm(x)
        q = self.self_attn.query(h, *rope_q)
        k, v = self.self_attn.key_value(h, *rope_q)
        kc, vc = self.self_attn.key_value(ctx, *rope_c) if ctx is not None else (None, None)
        x = x + self.self_attn.out(attend(q, k, v, kc, vc))
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraft(nn.Module):
    """fc + hidden_norm over the aux states, `layers.*` (DFlashLayer), norm, lm_head; the target's frozen
    embedding (its mask token embeds the mask slots); d2t / t2d as EAGLE-3's."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        if cfg.mask_token_id is None or not 0 <= cfg.mask_token_id < cfg.vocab_size:
            raise ValueError(
                f"a DFlash draft needs draft.mask_token_id in [0, {cfg.vocab_size}), got {cfg.mask_token_id}"
            )
        if not cfg.block_size or cfg.block_size < 2:
            raise ValueError(f"a DFlash draft needs a block_size >= 2, got {cfg.block_size}")
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)  # the target's, frozen
        self.fc = nn.Linear(cfg.fc_in_features, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList([DFlashLayer(cfg) for _ in range(cfg.num_layers)])
        add_output_head(self, cfg)
        self.reset_parameters()

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """Target aux states (B, T, n_aux*H_t) -> fc(aux) (B, T, H): vLLM's combine_hidden_states (DFlash has
        no norm_before_fc, EAGLE-3's option)."""
        return self.fc(aux.to(self.fc.weight.dtype))

    # the vocab map and the logits are EAGLE-3's (train/model.py, their one home)
    logits = Eagle3Draft.logits
    to_target_ids = Eagle3Draft.to_target_ids
    set_vocab_map = Eagle3Draft.set_vocab_map
    num_parameters = Eagle3Draft.num_parameters

    @property
    def decoder_layers(self) -> list[DFlashLayer]:
        return list(self.layers)

    def reset_parameters(self, std: float = 0.02) -> None:
        for lin in (self.fc, self.lm_head):
            nn.init.normal_(lin.weight, std=std)
        for layer in self.layers:
            a, m = layer.self_attn, layer.mlp
            for lin in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj):
                nn.init.normal_(lin.weight, std=std)
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)

    def compile_math(self) -> None:
        """torch.compile the norms' and MLPs' forward in place (as Eagle3Draft.compile_math)."""
        modules = [self.norm, self.hidden_norm]
        for m in self.layers:
            modules += [m.input_layernorm, m.post_attention_layernorm, m.mlp]
        for module in modules:
            module.forward = torch.compile(module.forward)

    def context(self, fused: torch.Tensor) -> torch.Tensor:
        """fc(aux) (B, C, H) -> the normed context every layer projects to keys / values."""
        return self.hidden_norm(fused)

    def block_inputs(self, anchors: torch.Tensor, slots: int) -> torch.Tensor:
        """anchor tokens (N,) -> the blocks' input ids (N, slots): the anchor, then the mask token."""
        ids = torch.full((anchors.shape[0], slots), self.config.mask_token_id, dtype=torch.long)
        ids = ids.to(anchors.device)
        ids[:, 0] = anchors
        return ids

    # ---- inference: the serving loop's cache (serve/decoding/cache.py) or a KVCache

    def write_context(self, fused: torch.Tensor, position_ids: torch.Tensor, cache) -> None:
        """Committed positions' context keys / values into `cache` (its planned slots): fused (B, C, H)
        fc(aux), position_ids (B, C). vLLM: precompute_and_store_context_kv."""
        ctx = self.context(fused)
        rope = self.rotary(position_ids, ctx.dtype)
        for i, layer in enumerate(self.layers):
            cache.update(*layer.self_attn.key_value(ctx, *rope), i)

    def block(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache, attn_mask) -> torch.Tensor:
        """One block per row: input_ids, position_ids (B, S); cache holds the context (written through
        write_context) and takes the block's own keys at its planned slots; attn_mask (B, S, L) which of the
        cache's L slots each slot sees (the context before the anchor and the whole block). -> logits
        (B, S, V_d)."""
        x = self.embed_tokens(input_ids).to(self.fc.weight.dtype)
        rope = self.rotary(position_ids, x.dtype)
        for i, layer in enumerate(self.layers):

            def attend(q, k, v, _kc, _vc, i=i):
                k_all, v_all = cache.update(k, v, i)
                gqa = k_all.shape[1] != q.shape[1]
                return F.scaled_dot_product_attention(
                    q, k_all, v_all, attn_mask=attn_mask[:, None], enable_gqa=gqa
                )

            x = layer(x, None, rope, rope, attend)
        return self.logits(x)

    @torch.no_grad()
    def fixed_round(self, ids: torch.Tensor, aux: torch.Tensor, pos: torch.Tensor) -> list[torch.Tensor]:
        """ids (B, T), aux (B, T, n_aux * H_t), pos (B, T): the context's keys, then one block after the last
        token -> [logits (B, block_size, V_d)]."""
        B, T = ids.shape
        S = self.config.block_size
        cache = KVCache()
        self.write_context(self.fuse(aux), pos, cache)
        slots = pos[:, -1:] + 1 + torch.arange(S)
        mask = torch.ones(B, S, T + S, dtype=torch.bool)
        return [self.block(self.block_inputs(ids[:, -1], S), slots, cache, mask)]


def anchor_picks(valid: torch.Tensor, per_row: int | None, seeds: list[int] | None) -> torch.Tensor:
    """valid (B, T) bool: indices i whose block (anchor i + 1) has a counted first draft -> kept (B, T) bool:
    `per_row` of them drawn at random in each row (all when fewer, or per_row None), each row from its own
    generator (row_seeds) when seeded."""
    if per_row is None:
        return valid.clone()
    kept = torch.zeros_like(valid)
    for b in range(valid.shape[0]):
        flat = valid[b].nonzero().squeeze(-1)
        if flat.numel() > per_row:
            gen = torch.Generator().manual_seed(seeds[b]) if seeds is not None else None
            flat = flat[torch.randperm(flat.numel(), generator=gen)[:per_row].to(flat.device)]
        kept[b, flat] = True
    return kept


def dflash_forward(
    draft: DFlashDraft,
    aux: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    doc_ids: torch.Tensor,
    target: TargetView | None,
    depths: int,
    decay: float = 0.8,
    attention: str = "auto",
    keep_logits: bool = False,
    checkpoint_layer: bool = False,
    loss: str = "kl",
    sampled_text: bool = False,
    sp=None,
    anchors: int | None = None,
    anchor_seed: tuple[int, ...] | None = None,
    dpace: float | None = None,
    truncate: bool = False,
) -> TTTOutput:
    """The blocks of `depths` + 1 slots (the draft's block_size) at the kept anchors of a right-padded
    (optionally packed) batch, scored as TTT's steps (module docstring): TTT's inputs and outputs. aux
    (B, T, n_aux*H_t); input_ids, loss_mask, doc_ids (B, T). `anchors`: blocks per row (None: one at every
    index); `anchor_seed` seeds each row's draw with its tokens (row_seeds; None: the global generator).
    With `keep_logits` (or no target) out.logits[d] (B, T, V_d) holds slot d + 1's logits at index i for
    the block anchored at i + 1, zeros off the kept anchors. `attention` is unused (SDPA over the blocks).
    `dpace` (alpha): D-PACE's weights over each block (`dpace_weights`) instead of decay**d. `truncate`
    (train.block_lengths random): each block keeps its first 1 .. depths drafts (`block_drafts`), its later
    slots neither seen by the block's other slots nor scored: the shorter blocks the loop runs at k < depths.
    `sp` (train/sequence_parallel.py): aux is this rank's shard [lo, hi) of each row and `target` the shard
    and its halo, the rest whole; the rank runs the blocks of its shard's indices against the whole row's
    context (`block_outputs`), and out holds the shard's grids (B, n, ...), the whole row's counts and run
    lengths and the shard's part of the row's loss."""
    if depths + 1 > draft.config.block_size:
        raise ValueError(
            f"{depths} drafts need a block of {depths + 1}; the draft's is {draft.config.block_size}"
        )
    if sp is not None and anchors and anchor_seed is None:
        raise ValueError("random anchors under sequence parallelism need anchor_seed: every rank draws alike")
    B, T = input_ids.shape
    lo, hi, _ = sp.bounds(T) if sp is not None else (0, T, T)
    S = depths + 1
    pos = positions_in_doc(doc_ids)  # (B, T) RoPE positions, restarting per packed sequence
    kept, drafts = pick_blocks(input_ids, loss_mask, doc_ids, depths, anchors, anchor_seed, truncate)
    mine = torch.zeros_like(kept)
    mine[:, lo:hi] = kept[:, lo:hi]

    # no anchor (a batch with nothing to learn: a rank's filler, an sp rank's shard): one block at index 0
    # whose output enters the loss times 0, so that every weight takes part (DDP / FSDP / ZeRO reduce
    # alike on each rank)
    any_kept = bool(mine.any())
    blocks = (
        mine if any_kept else torch.zeros_like(mine).index_fill_(1, mine.new_zeros(1, dtype=torch.long), True)
    )
    slots = drafts + 1 if drafts is not None and any_kept else None  # (B, T) the slots each block keeps
    prenorm = block_outputs(draft, aux, input_ids, doc_ids, pos, blocks, S, checkpoint_layer, sp, slots)
    idle = 0.0 if any_kept else prenorm.float().sum() * 0
    prenorm = prenorm if any_kept else prenorm[:0]
    opts = dict(
        decay=decay, keep_logits=keep_logits, loss=loss, sampled_text=sampled_text, sp=sp, dpace=dpace
    )
    batch = (input_ids, loss_mask, doc_ids)
    return score_blocks(draft, prenorm, kept, batch, target, depths, idle, drafts=drafts, **opts)


def pick_blocks(input_ids, loss_mask, doc_ids, depths: int, anchors, anchor_seed, truncate: bool) -> tuple:
    """The blocks a batch (B, T) trains -> (kept (B, T) bool: the indices i whose block, anchored at i + 1,
    runs; drafts (B, T) long: each block's drafts, None for all `depths`). Training (`anchors`): `anchors` a
    row drawn among the blocks whose first draft counts (the whole row's: every rank of an sp group draws
    the same), each row seeded by its tokens (row_seeds) where `anchor_seed` is given; validation: every
    block with a draft that counts. `truncate`: block_drafts."""
    B, T = input_ids.shape
    counted = torch.zeros(depths, B, T, dtype=torch.bool, device=input_ids.device)  # draft d at index i
    for d in range(min(depths, T - 2)):
        j = 2 + d  # x_{i+2+d}, loss-masked and in i's own sequence
        counted[d, :, : T - j] = loss_mask[:, j:].bool() & (doc_ids[:, j:] == doc_ids[:, :-j])
    seeds = row_seeds(anchor_seed, input_ids, counted[0]) if anchor_seed is not None and anchors else None
    kept = anchor_picks(counted[0] if anchors else counted.any(0), anchors, seeds)  # (B, T) indices i
    return kept, (block_drafts(kept, depths, seeds) if truncate else None)


def read_rows(
    input_ids, loss_mask, doc_ids, depths: int, anchors=None, anchor_seed=None, truncate=False, **_
) -> torch.Tensor:
    """The teacher's rows DFlash's training reads (TTTModule: target_view computes these alone) -> (B, T)
    bool: z_{i+1} .. z_{i+d} of each kept block's d drafts (draft d of the block anchored at i + 1 is scored
    against z_{i+1+d}; D-PACE reads the same), where the blocks are drawn reproducibly (anchor_seed). Every
    block (validation) or unseeded draws: the rows any counted token reads (train/ttt.py teacher_rows). The
    gpt-oss DFlash recipe's 512 blocks of 10 a row read about half of an answer's rows."""
    if not anchors or anchor_seed is None:
        return teacher_rows(loss_mask, depths)
    kept, drafts = pick_blocks(input_ids, loss_mask, doc_ids, depths, anchors, anchor_seed, truncate)
    rows, T = torch.zeros_like(kept), kept.shape[1]
    for d in range(min(depths, T - 1)):
        at = kept if drafts is None else kept & (drafts > d)
        rows[:, 1 + d :] |= at[:, : T - 1 - d]  # z_{i+1+d}
    return rows


def block_drafts(kept: torch.Tensor, depths: int, seeds: list[int] | None) -> torch.Tensor:
    """kept (B, T) bool -> (B, T) long: each kept block's drafts, uniform in 1 .. depths, 0 elsewhere; each
    row from its own generator (its anchors' seed, next in line: the same on every rank of an sp group)."""
    out = torch.zeros(kept.shape, dtype=torch.long, device=kept.device)
    for b in range(kept.shape[0]):
        gen = torch.Generator().manual_seed((seeds[b] + 1) % (1 << 63)) if seeds is not None else None
        n = int(kept[b].sum())
        out[b, kept[b]] = torch.randint(1, depths + 1, (n,), generator=gen).to(kept.device)
    return out


def score_blocks(
    draft,
    prenorm,
    kept,
    batch,
    target,
    depths,
    idle,
    *,
    decay,
    keep_logits,
    loss,
    sampled_text,
    sp,
    dpace,
    drafts=None,
) -> TTTOutput:
    """The blocks' outputs prenorm (N, S, H) at this rank's kept indices (kept (B, T): the whole row's) scored
    as TTT's steps on (B, n) grids of this rank's shard [lo, hi) (n = T without sp); batch: input_ids,
    loss_mask, doc_ids (B, T) whole. Under `sp` the counts and run lengths come back for the whole row and
    the loss is this shard's part of the row's (as ttt_forward); `idle` (0, or a zero that holds the
    idle block's graph) starts the loss. `drafts` (B, T) long: each block's drafts (block_drafts; None:
    all), draft d scored at the blocks that keep it. -> TTTOutput."""
    input_ids, loss_mask, doc_ids = batch
    B, T = input_ids.shape
    lo, hi, ext = sp.bounds(T) if sp is not None else (0, T, T)
    local = kept[:, lo:hi]  # (B, n) this rank's blocks, in block_outputs' (row-major) order
    flat = local.flatten().nonzero().squeeze(-1)  # (N,) b * n + i - lo
    out = TTTOutput(prenorm.new_zeros((), dtype=torch.float32) + idle, [], [], [], [], [])
    out.run_length = torch.zeros_like(local, dtype=input_ids.dtype)
    chain, stats, total = ChainState.start(B, hi - lo, input_ids.device), [], out.loss
    window = (loss_mask[:, lo:ext], doc_ids[:, lo:ext])  # the shard and its halo (the teacher's window)
    weights = None
    n_drafts = drafts[:, lo:hi] if drafts is not None else None
    if dpace is not None and target is not None:
        weights = dpace_weights(draft, prenorm, local, target, *window, dpace, n_drafts)
    for d in range(depths):
        grid = to_grid(prenorm[None, :, d + 1], flat, B, hi - lo)  # (B, n, H): slot d + 1 at index i
        at = kept if drafts is None else kept & (drafts > d)  # (B, T) the blocks that keep draft d
        here = at[:, lo:hi]
        if target is None or keep_logits:
            out.logits.append(draft.logits(grid) * here[..., None])
        if target is None:
            continue
        masked = loss_mask.bool() & shift_right(at, 2 + d)  # a prediction of x_{i+2+d} counts at kept i
        step_batch = (input_ids[:, lo:ext], masked[:, lo:ext], doc_ids[:, lo:ext])
        w = weights[d] if weights is not None else None
        loss_d, step, chain = score_step(
            draft, grid, d, step_batch, target, chain, loss, sampled_text, sp, w, rows=here
        )
        chain.text &= here[:, : chain.text.shape[1]]
        out.run_length[:, : chain.text.shape[1]] += chain.text
        total = total + (1.0 if weights is not None else decay**d) * loss_d
        stats.append(step)
    out.loss = total
    stats = torch.stack(stats) if stats else None
    if sp is not None:  # the whole row's counts and chains on every rank of the group
        stats = sp.sum(stats) if stats is not None else None
        out.run_length = sp.gather(out.run_length)
    fill_counts(out, stats, 1.0 if weights is not None else decay)  # logged as trained: D-PACE's in loss_d
    return out


@torch.no_grad()
def dpace_weights(
    draft, prenorm, kept, target: TargetView, loss_mask, doc_ids, alpha: float, drafts=None
) -> list:
    """D-PACE (speculators' dpace_loss_decay): in each block the weight of draft d is
    sum_{m >= d} prod_{l <= m} c_l over the trained drafts (the rest count as 1 in the product, 0 in the
    sum), c_l = (1 - alpha) q_l + alpha and q_l the draft's probability of the target's argmax: the expected
    accepted run that draft d's being right starts. -> per draft d a (B, n) grid at the kept indices.
    speculators takes q = exp(-CE) and so requires its CE loss; here q is the probability itself, whatever
    train.loss is. kept (B, n) the grid's indices (sp: this rank's shard, from its start); loss_mask, doc_ids
    and target (B, T) over the same start (sp: the shard and its halo); drafts (B, n) long each block's drafts
    (block_drafts; None: all): a draft past them is not trained."""
    (B, n), T = kept.shape, loss_mask.shape[1]
    N, S, _ = prenorm.shape
    b, i = kept.nonzero(as_tuple=True)  # (N,) rows, indices (row-major: the blocks' order)
    to_draft = torch.full((draft.config.vocab_size,), 0, dtype=torch.long, device=prenorm.device)
    ids = torch.arange(draft.config.draft_vocab_size, device=prenorm.device)
    to_draft[draft.to_target_ids(ids)] = ids
    q = prenorm.new_zeros(N, S - 1, dtype=torch.float32)
    trained = torch.zeros(N, S - 1, dtype=torch.bool, device=prenorm.device)
    for d in range(S - 1):
        at, pred = i + 1 + d, i + 2 + d  # the teacher z_{i+1+d} of x_{i+2+d}
        ok = pred < T
        at_c, pred_c = at.clamp(max=T - 1), pred.clamp(max=T - 1)
        counted = ok & loss_mask[b, pred_c].bool() & (doc_ids[b, pred_c] == doc_ids[b, i])
        trained[:, d] = (
            counted & target.in_draft[b, at_c] & (drafts[b, i] > d if drafts is not None else True)
        )
        logp = draft.logits(prenorm[:, d + 1]).float().log_softmax(-1)  # (N, V_d)
        q[:, d] = logp.gather(-1, to_draft[target.argmax[b, at_c]][:, None]).squeeze(-1).exp()
    c = torch.where(trained, (1 - alpha) * q + alpha, torch.ones_like(q))
    prefix = c.cumprod(-1) * trained
    w = prefix.flip(-1).cumsum(-1).flip(-1) * trained  # (N, S - 1)
    flat = kept.flatten().nonzero().squeeze(-1)  # (N,) b * n + i, once for every draft's grid
    return [to_grid(w[None, :, d, None], flat, B, n)[..., 0] for d in range(S - 1)]


def block_outputs(
    draft, aux, input_ids, doc_ids, pos, kept, S: int, ckpt: bool, sp=None, slots=None
) -> torch.Tensor:
    """The blocks anchored at i + 1 for the kept indices i (B, T) -> prenorm (N, S, H), N the kept count in
    row-major order (kept.flatten().nonzero()). Every row's blocks go through each layer in ONE call (the
    batch's context keys of all rows projected there): the same calls on every rank, which FSDP2's and
    ZeRO-3's gathers need. Under `sp` aux (B, n, n_aux*H_t) is this rank's shard: its context is gathered
    whole (SequenceParallel.all_tokens, once, before the layers), and every layer projects it all. `slots`
    (B, T) long: the slots each block keeps (its first ones; None: all S): the rest are keys to none."""
    ctx = draft.context(draft.fuse(aux))  # (B, T, H) (sp: (B, n, H), then the whole row's)
    if sp is not None:
        ctx = sp.all_tokens(ctx)
    b, i = kept.nonzero(as_tuple=True)  # (N,) rows, indices; anchors a = i + 1
    a = i + 1
    x = draft.embed_tokens(draft.block_inputs(input_ids[b, a], S)).to(ctx.dtype)  # (N, S, H)
    x = x.reshape(1, -1, ctx.shape[-1])  # (1, N * S, H)
    rope_q = draft.rotary((pos[b, a][:, None] + torch.arange(S, device=a.device)).reshape(1, -1), ctx.dtype)
    rope_c = draft.rotary(pos, ctx.dtype)  # (B, T, d)
    attend = block_attention(doc_ids, b, a, S, slots[b, i] if slots is not None else None)
    for layer in draft.layers:
        args = (x, ctx, rope_q, rope_c, attend)
        if ckpt and torch.is_grad_enabled():
            x = torch.utils.checkpoint.checkpoint(layer, *args, use_reentrant=False)
        else:
            x = layer(*args)
    return x.view(-1, S, x.shape[-1])


def block_attention(doc: torch.Tensor, rows: torch.Tensor, anchors: torch.Tensor, S: int, slots=None):
    """-> attend(q, k, v, kc, vc) for the batch's blocks: q, k, v (1, heads, N * S, d) the blocks' own (block
    j's slots at j * S .., its row rows[j], row-major), kc, vc (B, n_kv, T, d) the rows' context. Block j sees
    its row's context positions p < anchors[j] with doc[p] == doc[anchors[j]], and its own S keys
    (non-causal; `slots` (N,) long: only its first slots[j] keys). A row's blocks run in chunks: `chunk_of`
    bounds each chunk's scores (CPU) or mask (CUDA)."""
    B, T = doc.shape
    p = torch.arange(T, device=doc.device)
    sees = (p[None] < anchors[:, None]) & (doc[rows] == doc[rows, anchors][:, None])  # (N, T)
    bounds = torch.searchsorted(rows, torch.arange(B + 1, device=rows.device)).tolist()  # row r: [lo, hi)

    def attend(q, k, v, kc, vc):
        # the grouped heads repeated, not SDPA's enable_gqa: CUDA's SDPA with a mask takes its math kernel
        # for grouped heads; the CPU's flash kernel runs them, its backward ~14% slower (SmolLM2's DFlash
        # block, 128 anchors of 8 over 1,024 tokens, bf16: 50.8 against 43.7 ms a layer)
        rep = q.shape[1] // kc.shape[1]
        kc, vc = kc.repeat_interleave(rep, 1), vc.repeat_interleave(rep, 1)
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        outs, chunk = [], chunk_of(S, T, q.is_cuda)
        for r in range(B):
            for s in range(bounds[r], bounds[r + 1], chunk):
                e = min(bounds[r + 1], s + chunk)
                own = torch.eye(e - s, dtype=torch.bool, device=doc.device).repeat_interleave(S, 0)
                own = own.repeat_interleave(S, 1)  # (n * S, n * S): each block its own keys
                if slots is not None:  # a truncated block's later slots are keys to none
                    own = own & (torch.arange(S, device=doc.device) < slots[s:e, None]).flatten()[None]
                mask = torch.cat([sees[s:e].repeat_interleave(S, 0), own], dim=1)
                keys = torch.cat([kc[r : r + 1], k[:, :, s * S : e * S]], dim=2)  # (1, h, T + n * S, d)
                values = torch.cat([vc[r : r + 1], v[:, :, s * S : e * S]], dim=2)
                qs = q[:, :, s * S : e * S]
                outs.append(F.scaled_dot_product_attention(qs, keys, values, attn_mask=mask))
        return torch.cat(outs, dim=2)

    return attend


def chunk_of(S: int, T: int, cuda: bool) -> int:
    """Blocks a chunk of attention takes: n blocks' n * S queries over T + n * S keys within ANCHOR_KEYS
    elements (CPU: the scores a head, which its kernels may hold) or MASK_ELEMENTS (CUDA: the mask; the
    memory-efficient kernel holds no scores, and fewer chunks copy the context's keys fewer times)."""
    limit = MASK_ELEMENTS if cuda else ANCHOR_KEYS
    n = max(1, limit // (S * (T + S)))
    while n > 1 and n * S * (T + n * S) > limit:
        n = max(1, n * 3 // 4)
    return n


MODEL, UNROLL, ROWS = DFlashDraft, dflash_forward, read_rows  # read by the kind (train/kinds/base.py core)
