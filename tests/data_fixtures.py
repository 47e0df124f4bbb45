"""Tiny random gpt-oss targets with a word-level harmony-style tokenizer, for the data-stage tests.

`make_tiny_target(dir)` writes an ordinary model directory (config, safetensors weights,
generation config, tokenizer with a chat template) that `data.target.load_target` loads with
`from_pretrained`, exactly as it loads openai/gpt-oss-120b.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

SPECIAL_TOKENS = ["<|start|>", "<|message|>", "<|channel|>", "<|end|>", "<|return|>", "<|pad|>"]
WORDS = (
    "system user assistant final analysis you are a helpful model what is the capital of france "
    "tell me story about cat dog two plus three write poem on sea why sky blue how do birds fly "
    "name some colors count to five explain gravity please thanks hello world good bad yes no "
    "one four six seven eight nine ten red green"
).split()
CHAT_TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant<|channel|>final<|message|>{% endif %}"
)


# a small demo run on the CPU in fp32: 8 training prompts answered in at most 24 tokens
# (the server-backend and vLLM tests)
DEMO_SMALL = [
    "target.dtype=float32",
    "target.device=cpu",
    "data.num_prompts=10",
    "data.num_eval_prompts=2",
    "data.max_new_tokens=24",
    "data.batch_size=2",
]

# gpt-oss-120b's RoPE in form (yarn: theta 150000, factor 32 over 4096 positions, beta 32 / 1,
# truncate false), sized for a 512-position tiny target; vLLM's gpt_oss.py reads every key
TINY_GPT_OSS_YARN = {
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
}


def make_tokenizer():
    """A word-level fast tokenizer: [UNK], the harmony special tokens, then WORDS."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]"] + SPECIAL_TOKENS + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="[UNK]",
        pad_token="<|pad|>",
        eos_token="<|return|>",
        additional_special_tokens=SPECIAL_TOKENS,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def make_tiny_target(path: str | Path, num_layers: int = 4, seed: int = 0) -> Path:
    """Save a random GptOssForCausalLM (+ tokenizer, generation config) under `path`.

    Its eos ids are <|return|> and <|end|>; with seed 0 greedy decoding reaches one of them
    on some prompts and not on others."""
    from transformers import GptOssConfig, GptOssForCausalLM

    path = Path(path)
    tok = make_tokenizer()
    V = len(tok)
    cfg = GptOssConfig(
        num_hidden_layers=num_layers,
        num_local_experts=4,
        num_experts_per_tok=2,
        vocab_size=V,
        hidden_size=64,
        intermediate_size=64,
        head_dim=16,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=8,
        max_position_embeddings=512,
        rope_parameters=dict(TINY_GPT_OSS_YARN),
        initializer_range=0.2,
        tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.convert_tokens_to_ids("<|return|>"),
    )
    torch.manual_seed(seed)
    return save_target(GptOssForCausalLM(cfg).eval(), tok, path)


def make_family_target(
    path: str | Path,
    family: str,
    num_layers: int = 4,
    seed: int = 0,
    head_dim: int = 16,
    branch_scale: float = 1.0,
) -> Path:
    """A random tiny target of another family, saved like `make_tiny_target`: llama, mistral, or
    qwen3 (its small models tie the lm_head to the embedding, as here). vLLM's CPU attention needs
    head_dim >= 32.

    `branch_scale`: every layer's o_proj and down_proj (the residual branches) multiplied by it. At 1 the
    branches dwarf the embedding (RMS 8.2 against 0.2 after 3 layers) and the next token is a chaotic
    function of the context that no draft learns (a trained one measured tau 1.08 at k = 3); at 0.02 they
    are as large as the embedding (0.16), the answers become learnable and every layer still counts
    (zeroing any one layer's branches changes 28-38% of the next-token argmaxes)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen3Config

    path = Path(path)
    tok = make_tokenizer()
    shape = dict(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=512,
        initializer_range=0.2,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.convert_tokens_to_ids("<|return|>"),
    )
    cfg = {
        "llama": lambda: LlamaConfig(**shape, tie_word_embeddings=False),
        "mistral": lambda: MistralConfig(**shape, sliding_window=None, tie_word_embeddings=False),
        "qwen3": lambda: Qwen3Config(**shape, tie_word_embeddings=True),
    }[family]()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(branch_scale)
            layer.mlp.down_proj.weight.mul_(branch_scale)
    return save_target(model, tok, path)


def save_target(model, tok, path: Path) -> Path:
    """Save a tiny target like a hub checkpoint: greedy generation config ending at <|return|> or <|end|>."""
    from transformers import GenerationConfig

    eos = [tok.convert_tokens_to_ids("<|return|>"), tok.convert_tokens_to_ids("<|end|>")]
    model.generation_config = GenerationConfig(
        eos_token_id=eos, pad_token_id=tok.pad_token_id, bos_token_id=None, do_sample=False
    )
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def write_prompts(path: str | Path, n: int, seed: int = 0) -> Path:
    """`n` distinct OpenAI-layout records (a user turn of 2-10 words + an assistant answer
    that regeneration replaces)."""
    g = torch.Generator().manual_seed(seed)
    texts: list[str] = []
    while len(texts) < n:
        k = int(torch.randint(2, 11, (1,), generator=g))
        text = " ".join(WORDS[int(j)] for j in torch.randint(5, len(WORDS), (k,), generator=g))
        if text not in texts:
            texts.append(text)
    path = Path(path)
    path.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": t}, {"role": "assistant", "content": "no"}]})
            + "\n"
            for t in texts
        )
    )
    return path


@pytest.fixture(scope="module")
def one_thread():
    """Run a test module on one CPU thread: tiny models are dominated by thread sync on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Residual-branch scales (make_family_target) at which a family's random tiny target answers in a way a draft
# can learn, every layer still counting; Qwen3 ties its lm_head to the embedding, so at 0.02-0.05 it repeats
# the same token (tau 4.00 at k = 3) and needs 0.1
LEARNABLE_SCALE = {"llama": 0.02, "mistral": 0.02, "qwen3": 0.1}
# tiny_recipe's changes that train a draft on such a target in ~15 s (112 prompts, 16 of them held out for the
# eval, answers of up to 48 tokens, 100 steps at lr 3e-3)
LEARNABLE_TRAINING = {
    "data": {"max_new_tokens": 48, "num_eval_prompts": 16},
    "capture": {"shard_tokens": 4096},
    "train": {"max_steps": 100, "lr": 3e-3, "batch_size": 8, "log_every": 50},
    "eval": {"max_new_tokens": 48},
}


def learnable_run(target, run: Path, data_from: Path | None = None, **over) -> Path:
    """A draft trained by `run_all` into `run` on a learnable target (make_family_target, LEARNABLE_SCALE):
    LEARNABLE_TRAINING with its sections replaced by `over`'s, on 112 prompts written beside `run`;
    `data_from`: a run whose prompts, regeneration, capture and vocab it trains on (linked) -> `run`."""
    from eyas.pipeline import run_all
    from eyas.recipes.load import load_recipe

    data = ("prompts", "regenerate", "capture", "vocab")
    run.mkdir(parents=True, exist_ok=True)
    for stage in data if data_from else ():
        (run / stage).symlink_to(data_from / stage, target_is_directory=True)
    prompts = write_prompts(run.parent / "train.jsonl", 112, seed=1)
    recipe = tiny_recipe(target, prompts, **{**LEARNABLE_TRAINING, **over})
    run_all(load_recipe(recipe), run, stages=(*data, "train"), progress=False)
    return run


def tiny_recipe(target, prompts, **over) -> dict:
    """A raw recipe for the tiny target: every stage in seconds. `over`: section -> keys to change."""
    raw = {
        "name": "tiny",
        "target": {"model": str(target)},
        "data": {"prompts": str(prompts), "num_eval_prompts": 4, "max_new_tokens": 12, "batch_size": 8},
        "capture": {"batch_size": 4, "shard_tokens": 96},
        "vocab": {"draft_vocab_size": 40},
        "train": {"max_steps": 4, "batch_size": 4, "ttt_steps": 3, "log_every": 1},
        "eval": {"k": 3, "max_new_tokens": 12},
    }
    for k, v in over.items():
        raw[k] = {**raw.get(k, {}), **v}
    return raw


def assert_capture_exact(
    model, reference, sequences: list, layer_ids: list[int], hidden: int, what: str = ""
) -> None:
    """Capture `sequences` (right padded, one batch) from `model` through the tap and compare with
    `reference`'s output_hidden_states, exactly: vLLM ids, k = input of decoder layer k =
    hidden_states[k]; the final state = hidden_states[-1] (post-norm); the logits."""
    from eyas.data.capture import capture_batch, right_padded
    from eyas.data.target import tapped

    ids, mask = right_padded(sequences)
    with tapped(model, layer_ids) as tap:
        aux, final, logits = capture_batch(model, tap, ids, mask)
    with torch.no_grad():
        out = reference(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    for j, k in enumerate(layer_ids):
        assert torch.equal(aux[..., j * hidden : (j + 1) * hidden], out.hidden_states[k]), (
            f"{what} aux layer id {k}"
        )
    assert torch.equal(final, out.hidden_states[-1]), f"{what} final state"
    assert torch.equal(logits, out.logits), f"{what} logits"


def split_map(num_layers: int, embed: str = "cpu", lm_head: str = "disk") -> dict[str, str]:
    """A target.device_map that splits a tiny target the way a multi-GPU placement does: even decoder
    layers in RAM, odd ones on disk (with offload_folder: accelerate's hooks load them for each
    forward, and their weights sit on "meta"); the embedding and the lm_head where asked."""
    m = {"model.embed_tokens": embed, "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": lm_head}
    m.update({f"model.layers.{i}": "disk" if i % 2 else "cpu" for i in range(num_layers)})
    return m


TURNS = 3  # user turns per conversation of write_conversations


def write_conversations(path: Path, n: int = 8) -> Path:
    """`n` ShareGPT-layout conversations of TURNS user turns (demo prompts), each with a stale answer, every
    other one with a system message."""
    from eyas.data.target import resolve_path
    from eyas.infra.io import read_jsonl

    users = [r["messages"][0]["content"] for r in read_jsonl(f"{resolve_path('eyas-demo')}/prompts.jsonl")]
    rows = []
    for i in range(n):
        turns = []
        for u in users[TURNS * i : TURNS * (i + 1)]:
            turns += [{"from": "human", "value": u}, {"from": "gpt", "value": "a stale answer"}]
        system = [{"from": "system", "value": "Answer briefly."}] if i % 2 else []  # else the template's own
        rows.append({"conversations": [*system, *turns]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def prompt_lengths_by_characters(rows: list[dict], kept: float) -> list[float]:
    """What `eyas plan` prices each turn's prompt at without a tokenizer, by hand: the messages so far at 4
    characters a token and 8 tokens a message, and `kept` tokens of each earlier answer."""
    lengths = []
    for row in rows:
        system = [m["content"] for m in row["messages"] if m["role"] == "system"]
        users = [m["content"] for m in row["messages"] if m["role"] == "user"]
        for t in range(len(users)):
            chars = len("".join(system + users[: t + 1]))
            lengths.append(chars / 4 + 8 * (len(system) + 2 * t + 1) + t * kept)
    return lengths
