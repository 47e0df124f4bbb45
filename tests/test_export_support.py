"""Builders shared by the export / import / publish tests (no tests here).

A tiny Llama target saved as an ordinary model directory, small random drafts that use its
embedding, and a fabricated finished run directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eyas.train import kinds
from eyas.train.checkpoint import save_draft
from eyas.train.kinds.config import DraftConfig
from eyas.train.model import Eagle3Draft

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, TARGET_LAYERS = 97, 32, 4, 2, 8, 8
DRAFT_VOCAB = 40

YARN = {
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 64,
}


def tiny_target(root: Path) -> Path:
    """A Llama target directory (8 layers, vocab 97, hidden 32), cached under `root`."""
    path = root / "tiny-target"
    if (path / "config.json").is_file():
        return path
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1234)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=TARGET_LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def target_embed(target: Path) -> torch.Tensor:
    from eyas.data.target import load_head_weights

    return load_head_weights(str(target))["embed"]


def random_vocab_map(seed: int, draft_vocab: int = DRAFT_VOCAB, vocab: int = VOCAB):
    g = torch.Generator().manual_seed(seed)
    used = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[used] = True
    return used - torch.arange(draft_vocab), t2d


def make_draft(
    seed: int,
    target: Path | None = None,
    rope: dict | None = None,
    aux=(2, 4, 6),
    std: float = 0.2,
    **options,
) -> Eagle3Draft:
    """A random fp32 draft whose embedding is the target's (when given) and whose vocab map is random;
    `options`: DraftConfig's norm_before_fc, norm_before_residual, num_layers, kind and mask_token_id."""
    torch.manual_seed(seed)
    cfg = DraftConfig(
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        intermediate_size=48,
        vocab_size=VOCAB,
        draft_vocab_size=DRAFT_VOCAB,
        aux_layer_ids=list(aux),
        max_position_embeddings=2048,
        rope_parameters=dict(rope or {"rope_type": "default", "rope_theta": 10000.0}),
        target_model=str(target) if target else None,
        **options,
    )
    draft = kinds.make_draft(cfg).float().eval()
    draft.reset_parameters(std=std)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
        if target is not None:
            draft.embed_tokens.weight.copy_(target_embed(target))
    draft.set_vocab_map(*random_vocab_map(seed))
    return draft


REPORT = {
    "acceptance_length": 3.1416,
    "k": 4,
    "per_position_acceptance": [0.91, 0.74, 0.55, 0.38],
    "lossless": True,
    "num_prompts": 32,
    "tokens_per_second": {"speculative": 88.5, "baseline": 41.2},
    "speedup": 2.148,
    "target_entropy": 0.73,
    "stage_times": {"prompts": 3.0, "train": 120.5},
    "target": "openai/gpt-oss-120b",
    "draft": "train/checkpoint-final",
    "eval_settings": {"max_new_tokens": 256, "greedy": True, "benchmark": "held-out"},
    "results": [
        {
            "draft": "eyas",
            "benchmark": "held-out",
            "k": 4,
            "acceptance_length": 3.1416,
            "per_position_acceptance": [0.91, 0.74, 0.55, 0.38],
            "lossless": True,
            "num_prompts": 32,
            "tokens_per_second": 88.5,
        },
        {
            "draft": "eyas",
            "benchmark": "mt-bench",
            "k": 4,
            "acceptance_length": 2.7182,
            "per_position_acceptance": [0.85, 0.62, 0.41, 0.25],
            "lossless": True,
            "num_prompts": 80,
            "tokens_per_second": 70.1,
        },
    ],
    "recommendation": [
        {
            "draft": "eyas",
            "benchmark": "held-out",
            "temperature": 0.0,
            "concurrency": 1,
            "k": 3,
            "tree": None,
            "choice": "k=3",
            "predicted_speedup": 1.8,
            "measured_speedup": 1.75,
            "predicted_tau": 3.2,
        },
        {
            "draft": "eyas",
            "benchmark": "held-out",
            "temperature": 0.0,
            "concurrency": 64,
            "k": 0,
            "tree": None,
            "choice": "k=0",
            "predicted_speedup": 1.0,
            "measured_speedup": None,
            "predicted_tau": 1.0,
        },
    ],
}

RECIPE = """name: tiny
target:
  model: {target}
data:
  prompts: eyas-demo/prompts.jsonl
  num_prompts: 64
  max_new_tokens: 256
vocab:
  draft_vocab_size: 40
train:
  ttt_steps: 7
  lr: 0.0001
"""


def fabricate_run(root: Path, draft: Eagle3Draft) -> Path:
    """RUN/ with train/checkpoint-final, report.json, recipe.yaml and stage DONE.json markers."""
    run = root / "run"
    save_draft(draft, run / "train" / "checkpoint-final", dtype=torch.float32)
    (run / "report.json").write_text(json.dumps(REPORT, indent=2))
    (run / "recipe.yaml").write_text(RECIPE.format(target=draft.config.target_model))
    stats = {
        "prompts": {"num_prompts": 64, "num_eval_prompts": 32},
        "capture": {"tokens": 16384, "shards": 1, "aux_layer_ids": [2, 4, 6]},
        "train": {"steps": 200, "final_loss": 1.2345, "simulated_acceptance": {"tau": 3.3}},
    }
    for stage, info in stats.items():
        (run / stage).mkdir(parents=True, exist_ok=True)
        (run / stage / "DONE.json").write_text(json.dumps(info))
    return run
