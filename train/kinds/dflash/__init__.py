"""DFlash: a block of drafts from one non-causal forward fed the target's states as keys / values, trained on
random anchors.

The model and its unroll are core.py (`DFlashDraft`, `dflash_forward`), its own published layouts are
layout.py (z-lab's, and speculators'); what the rest of eyas asks of the kind is `DFlash` below (the
interface: train/kinds/base.py).
"""

from __future__ import annotations

from ..base import DraftKind
from .config import DFlashConfig
from .layout import ARCHITECTURE, dflash_config, dflash_speculators_config, read_dflash_config


def anchor_share(tr) -> float:
    """The share of a row's positions that anchor a block in training (max_anchors of max_length)."""
    return min(tr.max_anchors, tr.max_length) / tr.max_length


class DFlash(DraftKind):
    name = "dflash"
    summary = "DFlash: a block of drafts from one non-causal forward (random anchors)"
    core = "eyas.train.kinds.dflash.core"
    draft_section = "eyas.train.kinds.dflash.recipe:DFlashSection"  # its recipe `draft` keys
    config_class = DFlashConfig
    chains_only = True
    sp_splits_heads = False  # it gathers the row's context instead
    anchor_row = True
    mask_slots = True
    own_options = ("train.block_lengths",)  # its draft keys are its section's (recipe.py)
    proposal = "eyas.train.kinds.dflash.loop:propose_block"
    commit = "eyas.train.kinds.dflash.loop:write_context"  # a committed token writes its context keys
    formats = ("dflash", "speculators")
    engines = ("vllm",)
    speculators_type = "dflash"
    vllm_model = "qwen3_dflash.py"
    layer_family = "Qwen3"
    card_title = "A DFlash (block drafting) speculative-decoding draft"
    card_layout = "z-lab's DFlash layout (`fc`, `hidden_norm`, `layers.*` Qwen3 layers, `norm`, `lm_head`)"
    card_aux = (
        "vLLM reads the target layers from `dflash_config.target_layer_ids` (output-of-layer numbering: eyas "
        "id - 1) and the mask token from `dflash_config.mask_token_id`; a block is `num_speculative_tokens` "
        "+ 1 slots."
    )

    def options(self, tr) -> dict:
        # blocks at random anchors, drawn per row from its tokens and the epoch (train/trainer.py reseed)
        return {
            "anchors": tr.max_anchors,
            "anchor_seed": (tr.seed, 0),
            "dpace": tr.dpace_alpha if tr.block_weight == "dpace" else None,
            "truncate": tr.block_lengths == "random",
        }

    def trained_k(self, tr) -> list[int]:
        # whole blocks only, unless train.block_lengths random trains every shorter one
        return [tr.ttt_steps] if tr.block_lengths == "full" else super().trained_k(tr)

    def untrained_k(self, trained: list[int] | None, k: int) -> str | None:
        if trained is None or k in trained:
            return None
        t = max(trained)
        if len(trained) == 1:
            return (
                f"k={k}: this DFlash draft trained whole blocks of {t + 1} only (train.block_lengths: full); "
                f"a shorter block's slots see fewer mask slots than in training: serve k = {t}, or train it "
                "with train.block_lengths: random"
            )
        return f"k={k}: this DFlash draft trained blocks of up to {t + 1}: serve k <= {t}"

    def k_problem(self, cfg, k: int) -> str | None:
        block = cfg.block_size
        return (
            f"a DFlash block of {block} drafts at most {block - 1} tokens, not {k}" if k > block - 1 else None
        )

    def check_recipe(self, recipe, check) -> None:
        """The block and train.ttt_steps (its drafts) agree, one following the other; eval.k follows the
        block (it trains whole, so it serves whole)."""
        d, tr = recipe.draft, recipe.train  # its section (recipe.py) has no EAGLE-3 layer options
        if d.block_size is None:
            d.block_size = tr.ttt_steps + 1 if "ttt_steps" in tr.model_fields_set else 16
            tr.ttt_steps = d.block_size - 1
        elif "ttt_steps" not in tr.model_fields_set:
            tr.ttt_steps = d.block_size - 1
        drafts = f"a block of {d.block_size} drafts {d.block_size - 1} tokens: set train.ttt_steps to that"
        check(tr.ttt_steps == d.block_size - 1, "train.ttt_steps", drafts)
        if "k" not in recipe.eval.model_fields_set:
            recipe.eval.k = tr.ttt_steps

    def draft_forwards(self, shape) -> int:
        return 1  # one block a round (the context's keys: a projection per token)

    flops_priced_training = False  # its training rate stays per token in eyas plan --run

    def unrolled(self, tr) -> float:
        # the blocks' tokens through every layer: max_anchors blocks of ttt_steps + 1 slots per row
        return anchor_share(tr) * (tr.ttt_steps + 1)

    def on_grid(self, tr) -> float:
        # each draft's loss on the (B, T) grid, zeros off the kept anchors (core.py)
        return float(tr.ttt_steps)

    def loss_rows(self, tr) -> tuple[bool, float]:
        # every draft's loss over its kept anchors alone, gathered (core.py)
        return False, anchor_share(tr)

    def grid_bytes(self, tr, c) -> tuple[float, float]:
        """Each draft's loss reads its grid of states (two copies), and every layer projects the whole row's
        context to keys and values (k before and after its norm and RoPE, v; bf16) and its attention keeps
        [context ; blocks] keys and values for every query head (repeated for CUDA's kernel, one chunk), plus
        the fused and normed context itself (fp32). Under sequence parallelism the context's keys and values
        (and the gathered context) are the whole row's, and so are the blocks' (all of a row's anchors may
        lie in one shard: train/sequence_parallel.py)."""
        heads = 2 * 2 * c.num_attention_heads * c.head_dim  # a key and a value for every query head (bf16)
        context = c.num_layers * (3 * 2 * c.num_key_value_heads * c.head_dim + heads)  # a context token's
        blocks = c.num_layers * heads * anchor_share(tr) * (tr.ttt_steps + 1)  # the keys of its blocks
        shard = 2 * 2 * c.hidden_size * self.on_grid(tr) + 2 * 4 * c.hidden_size
        return shard, context + blocks + (4 * c.hidden_size if tr.sequence_parallel > 1 else 0)

    def unrolled_whole_row(self) -> bool:
        return True

    def plan_note(self, tr, unrolled: float) -> str:
        whole = " (the whole row's on each GPU)" if tr.sequence_parallel > 1 else ""
        return (
            f"x {unrolled:.3f} steps' worth ({tr.max_anchors} blocks of {tr.ttt_steps + 1} a row) + "
            f"{tr.ttt_steps} drafts' loss on the (B, T) grid + the context's keys and values{whole} (DFlash)"
        )

    def published(self, raw: dict) -> bool:
        return raw.get("speculators_model_type") == self.speculators_type or ARCHITECTURE in (
            raw.get("architectures") or []
        )

    always_vocab_map = False  # z-lab's layout: d2t / t2d only where the vocabulary is cut

    def card_options(self, cfg) -> str:
        return (
            f"| options | block_size {cfg.block_size} (the anchor and {cfg.block_size - 1} mask slots), "
            f"mask_token_id {cfg.mask_token_id}, attention_bias {str(cfg.attention_bias).lower()} "
            "(vLLM qwen3_dflash.py) |"
        )

    def card_ids(self, ids: list[int], sglang_ids: list[int]) -> list[str]:
        return [
            f"- `dflash_config.target_layer_ids: {[k - 1 for k in ids]}` — z-lab's numbering, the *output* "
            "of decoder layer j = k - 1; vLLM adds 1 back (get_eagle3_aux_layers_from_config)."
        ]

    def vllm_config(self, model: str, k: int) -> dict:
        return {"method": "dflash", "model": model, "num_speculative_tokens": k}

    def engine_problem(self, engine_label: str) -> str:
        return "draft kind dflash: eyas exports it for vLLM (method dflash, qwen3_dflash.py) only"

    own_layer_names = True  # Qwen3's `layers.i.`

    def checkpoint_config(self, cfg, dtype) -> dict:
        return dflash_config(cfg, dtype)  # z-lab's layout, not EAGLE-3's

    def published_config(self, cfg, fmt: str, dtype, k: int, verifier: tuple[str, list[str]] | None) -> dict:
        """layout.py: z-lab's, or speculators' (whose k is its block's, block_size - 1)."""
        if fmt == "speculators":
            return dflash_speculators_config(cfg, dtype, *verifier)
        return dflash_config(cfg, dtype)

    def read_published(self, raw: dict, target: str | None, where: str):
        return read_dflash_config(raw, target, where)


DFLASH = DFlash()
