"""Tiny random gpt-oss targets (transformers' own GptOssForCausalLM) for fast tests."""

import torch
from data_fixtures import TINY_GPT_OSS_YARN
from transformers import GptOssConfig, GptOssForCausalLM


def tiny_gpt_oss(
    seed=0, layers=4, hidden=64, vocab=128, window=8, experts=4, heads=4, kv=2, head_dim=16, rope=None
):
    torch.manual_seed(seed)
    cfg = GptOssConfig(
        num_hidden_layers=layers,
        num_local_experts=experts,
        num_experts_per_tok=2,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden,
        head_dim=head_dim,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        sliding_window=window,
        max_position_embeddings=1024,
        rope_parameters=rope or {**TINY_GPT_OSS_YARN, "factor": 8.0},  # 8 * 128 = 1024 positions
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    model = GptOssForCausalLM(cfg).float().eval()
    # larger-than-default weights: sharper, more varied distributions than N(0, 0.02)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.3 if "embed" in name or "lm_head" in name else 0.1)
    return model


def draft_for(target, seed, aux_ids=None, kind="eagle3"):
    """A random draft of `kind` (EAGLE-3; peagle: P-EAGLE with mask token 3; dflash: DFlash, mask token 3,
    block 6, 2 layers) for `target` (its embedding; draft vocab = every other target id)."""
    from eyas.train.kinds import make_draft
    from eyas.train.kinds.config import DraftConfig

    tc = target.config
    torch.manual_seed(seed)
    ids = aux_ids or [0, 2, tc.num_hidden_layers - 1]
    mask = {"kind": kind, "mask_token_id": 3} if kind != "eagle3" else {}
    if kind == "dflash":
        mask.update(block_size=6, num_layers=2)
    cfg = DraftConfig.from_target_config(tc, ids, draft_vocab_size=tc.vocab_size // 2, **mask)
    d = make_draft(cfg)
    d.embed_tokens.weight.data.copy_(target.get_input_embeddings().weight)
    kept = torch.arange(cfg.draft_vocab_size) * 2  # every other target id
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[kept] = True
    d.set_vocab_map(kept - torch.arange(cfg.draft_vocab_size), t2d)
    return d.eval()
