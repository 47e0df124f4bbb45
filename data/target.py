"""The target model: resolving its name, loading it, and reading its hidden states.

Every stage loads the target the same way, with `from_pretrained` on a directory or hub id,
whether it is openai/gpt-oss-120b or the built-in demo target ("eyas-demo", an ordinary
model directory built and cached on first use).

Placement: the whole target on one device (`target.device`), or across devices with a
`target.device_map` (a plan accelerate computes from `target.max_memory`, or an explicit map of
module names to GPUs, cpu or disk), as `from_pretrained(device_map=...)` takes it. Inputs go to the
device of the embedding; accelerate's hooks carry activations from device to device; the tap
below gathers the aux states onto one device.

Layer-id convention (vLLM's `eagle_aux_hidden_state_layer_ids`): id k is the INPUT of
decoder layer k (0-based), which is Hugging Face `hidden_states[k]`, for 0 <= k < N. Extended
exactly as vLLM's boundary numbering (the residual stream after k layers; vLLM PR #36063) does:
id N is the OUTPUT of the last decoder layer, before the final norm, which is NOT Hugging Face
`hidden_states[N]` (that one is after the final norm). The final state is the input of the
target's output embedding (`lm_head`), i.e. after the final norm.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from eyas.data import gguf
from eyas.data.demo_target.full_width import ensure_full_width_target
from eyas.data.hub import model_errors
from eyas.infra.errors import InputError
from eyas.infra.vllm.vllm_env import refuse_mxfp4_without_kernels

if TYPE_CHECKING:
    from transformers import PretrainedConfig

DEMO_TARGET = "eyas-demo"
FULL_WIDTH_TARGET = "eyas-full-width"  # gpt-oss-120b's widths, 4 layers (data/demo_target/full_width.py)
LAYER_ID_CONVENTION = (
    "vLLM: id k = input of decoder layer k (0-based) = HF hidden_states[k] for k < N; "
    "id N = output of the last decoder layer before the final norm"
)


def resolve_path(name: str) -> str:
    """`eyas-demo` and `eyas-demo/<file>` resolve inside the demo target's cached directory
    (building it on first use); a GGUF (a .gguf file, ORG/NAME/FILE.gguf on the hub, or a packaged
    model such as smollm2-135m-instruct) to its dequantized directory in eyas's cache (data/gguf.py);
    anything else is returned unchanged (a path or hub id)."""
    if gguf.is_gguf(name):
        return str(gguf.model_dir(name))
    if name == FULL_WIDTH_TARGET:
        return str(ensure_full_width_target())
    if name == DEMO_TARGET or name.startswith(DEMO_TARGET + "/"):
        from eyas.data.demo_target.build import ensure_demo_target  # lazy: tokenizers, transformers

        root = ensure_demo_target()
        return str(root / name[len(DEMO_TARGET) + 1 :]) if name != DEMO_TARGET else str(root)
    return name


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if dtype == "bfloat16" and not cpu_bf16_runs(device, "the target in bfloat16"):
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def native_bf16_cpu() -> bool:
    """Whether this CPU multiplies bf16 in hardware: on x86, AVX512-BF16 or AMX. Without either (an AVX2
    core) torch's bf16 matmuls run ~100x slower than its float32 ones: 1.3 against 121 GFLOP/s on a 2-core
    AVX2 EPYC, where AMX makes bf16 ~10x faster than float32. Other CPUs (Arm's bf16 extensions) are taken
    at their word: True."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return True
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


_SAID: set[str] = set()


def cpu_bf16_runs(device: torch.device, what: str) -> bool:
    """False, with a note once per `what` (the recipe field asking for bf16), where `device` is a CPU
    without native bf16 (`native_bf16_cpu`): the caller then computes in float32, the same results within
    the two precisions' rounding at ~100x the speed there (and twice bf16's memory for the target) rather
    than hours of emulated bf16. True elsewhere."""
    if device.type != "cpu" or native_bf16_cpu():
        return True
    if what not in _SAID:
        _SAID.add(what)
        print(
            f"[eyas] {what}: this CPU has no bf16 arithmetic (AVX512-BF16 / AMX; torch reports "
            f"{torch.backends.cpu.get_cpu_capability()}), where bf16 runs ~100x slower than float32: "
            "computing in float32",
            file=sys.stderr,
            flush=True,
        )
    return False


def server_dtype(dtype: str) -> str:
    """`target.dtype` for a vLLM server started on this machine: where it runs on the CPU (this torch sees no
    GPU) and the CPU has no native bf16 (`cpu_bf16_runs`), float32 for bfloat16, and for auto (vLLM's
    auto would cast a float32 checkpoint to bf16 on a CPU)."""
    if dtype in ("bfloat16", "auto") and not cpu_bf16_runs(pick_device("auto"), "the target in bfloat16"):
        return "float32"
    return dtype


def load_target(
    name: str,
    dtype: str = "auto",
    device: str = "auto",
    trust_remote_code: bool = False,
    device_map: str | dict[str, str] | None = None,
    max_memory: dict[str, str] | None = None,
    offload_folder: str | None = None,
    weights: str = "auto",
):
    """-> (model in eval mode, tokenizer). `name` is a directory or hub id. Without `device_map` the
    whole model goes to `device`; with one, it is placed as the recipe's `target` section says.
    `weights` (auto | mxfp4 | dequantized) is how an MXFP4 checkpoint (gpt-oss) is held: see
    `weight_format`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_path(name)
    dev = pick_device(device)
    placed = {} if device_map is None else placement_kwargs(device_map, max_memory, offload_folder)
    torch_dtype = pick_dtype(dtype, dev)
    mxfp4 = stored_as_mxfp4(load_target_config(path, trust_remote_code))
    if weights != "auto" and not mxfp4:
        raise ValueError(
            f"target.weights={weights}: {name} does not store MXFP4 weights; leave target.weights at auto"
        )
    if weights == "dequantized":
        from transformers import Mxfp4Config

        placed["quantization_config"] = Mxfp4Config(dequantize=True)
    with model_errors(name):
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch_dtype, trust_remote_code=trust_remote_code, **placed
        )
    if mxfp4:
        print(f"target: {weight_format(model, weights, torch_dtype)}", flush=True)
    if device_map is None:
        model.to(dev)
    else:
        print(f"target: {describe_placement(model, device_map)}", flush=True)
    model.eval()
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    return model, tok


def input_device(model: nn.Module) -> torch.device:
    """Where a target's input ids go: its embedding's device, or, where the device_map offloaded the
    embedding (its weight on "meta"), the device accelerate's hook runs it on."""
    emb = model.get_input_embeddings()
    hooks = getattr(getattr(emb, "_hf_hook", None), "hooks", None) or [getattr(emb, "_hf_hook", None)]
    for hook in hooks:
        dev = getattr(hook, "execution_device", None)
        if dev is not None:
            return torch.device("cuda", dev) if isinstance(dev, int) else torch.device(dev)
    return emb.weight.device


def compute_dtype(model: nn.Module) -> torch.dtype:
    """The dtype a target computes in: its first floating-point parameter's (an MXFP4 target dequantized by
    transformers: bf16)."""
    return next(p for p in model.parameters() if p.is_floating_point()).dtype


def stored_as_mxfp4(cfg) -> bool:
    """Whether a checkpoint's config says its weights are MXFP4 (gpt-oss: the MoE experts)."""
    q = getattr(cfg, "quantization_config", None)
    method = q.get("quant_method") if isinstance(q, dict) else getattr(q, "quant_method", None)
    return str(getattr(method, "value", method)) == "mxfp4"


def weight_format(model: nn.Module, asked: str, dtype: torch.dtype) -> str:
    """How transformers held an MXFP4 checkpoint, said in words; `asked` = mxfp4 fails unless it kept
    MXFP4 (it dequantizes where its kernels cannot run: without a CUDA GPU with triton >= 3.4 and the
    `kernels` package, or on CPU)."""
    if getattr(model, "is_quantized", False):
        return "MXFP4 weights kept (transformers' MXFP4 kernels)"
    if asked == "mxfp4":
        raise RuntimeError(
            "target.weights=mxfp4: transformers dequantized the MXFP4 weights, because its MXFP4 "
            "kernels cannot run here (they need a CUDA GPU, triton >= 3.4 and the `kernels` "
            "package); set target.weights to auto or dequantized, and plan for the bf16 size"
        )
    why = "as target.weights asks" if asked == "dequantized" else "MXFP4 kernels unavailable here"
    return f"MXFP4 weights dequantized to {str(dtype).removeprefix('torch.')} ({why})"


def mxfp4_kernels_run() -> bool:
    """Whether transformers would keep an MXFP4 checkpoint in MXFP4 here (its quantizer_mxfp4.py's test): a
    CUDA GPU of compute capability >= 7.5 with triton >= 3.4, or a CPU with triton >= 3.5, and the `kernels`
    package (which fetches the kernels from the hub at run time). Elsewhere it dequantizes."""
    from transformers.utils import is_kernels_available, is_triton_available

    if torch.cuda.is_available():
        ok = torch.cuda.get_device_capability() >= (7, 5) and is_triton_available("3.4.0")
    else:
        ok = is_triton_available("3.5.0")
    return ok and is_kernels_available()


MXFP4_BYTES = 4.25 / 8  # e2m1 values (4 bits) + one e8m0 scale byte per 32


@dataclass
class TargetCount:
    """The target's parameters, and the bytes its weights take."""

    params: int
    expert_params: int  # the MoE experts' weight matrices (what gpt-oss stores in MXFP4)
    bytes_mxfp4: float  # the experts in MXFP4, the rest in bf16
    bytes_bf16: int


def count_target(cfg: PretrainedConfig) -> TargetCount:
    """Parameters of the target, built on the meta device: total, MoE experts' weight matrices (what
    gpt-oss stores in MXFP4), and bytes in MXFP4 and in bf16."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    total = experts = 0
    for name, p in model.named_parameters():
        total += p.numel()
        if ".experts." in name and not name.endswith("_bias") and p.dim() == 3:
            experts += p.numel()
    mxfp4 = experts * MXFP4_BYTES + (total - experts) * 2
    return TargetCount(params=total, expert_params=experts, bytes_mxfp4=mxfp4, bytes_bf16=2 * total)


def held_bytes(t) -> tuple[float, str]:
    """What the recipe's target section `t` makes transformers hold: (bytes, how), e.g. (2.34e11, "bf16, its
    MXFP4 experts dequantized: transformers' MXFP4 kernels cannot run here"). Counted on the meta device
    (count_target), nothing loaded."""
    cfg = load_target_config(t.model, t.trust_remote_code)
    count = count_target(cfg)
    dtype = pick_dtype(t.dtype, pick_device(t.device if t.device_map is None else "auto"))
    name, size = str(dtype).removeprefix("torch."), torch.finfo(dtype).bits // 8
    if not stored_as_mxfp4(cfg):
        return count.params * size, name
    if t.weights == "mxfp4" or (t.weights == "auto" and mxfp4_kernels_run()):
        return count.bytes_mxfp4, "MXFP4 experts"
    why = (
        "as target.weights asks"
        if t.weights == "dequantized"
        else "transformers' MXFP4 kernels cannot run here"
    )
    return count.params * size, f"{name}, its MXFP4 experts dequantized ({why})"


def memory_it_would_use(t) -> tuple[float, str] | None:
    """The memory of the devices the target section `t` places the target on: (bytes, which); None where a
    device_map may offload to the CPU or disk (then anything fits)."""
    if t.device_map is not None:
        if not torch.cuda.is_available() or set(t.max_memory or {}) & {"cpu", "disk"}:
            return None
        if isinstance(t.device_map, dict):
            if set(t.device_map.values()) & {"cpu", "disk"}:
                return None
            gpus = sorted({int(_device(d)) for d in t.device_map.values()})
        else:
            gpus = list(range(torch.cuda.device_count()))
        total = sum(torch.cuda.get_device_properties(i).total_memory for i in gpus)
        return total, f"the {len(gpus)} GPUs of target.device_map"
    dev = pick_device(t.device)
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).total_memory, f"the GPU it would use ({dev})"
    return host_memory_bytes(), "this machine's memory (the CPU)"


def host_memory_bytes() -> int:
    """This machine's physical memory (what a target on its CPU, or `eyas plan --gpus cpu`, has)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits(t, fix: str) -> None:
    """Refuse, before anything is loaded, a target that cannot fit the devices it would be loaded on: one
    InputError naming target.weights (target.dtype for a checkpoint not stored in MXFP4), both sizes and
    `fix` (the vLLM backend of the stage: vLLM runs gpt-oss's MXFP4 experts on every GPU it supports)."""
    have = memory_it_would_use(t)
    need, how = held_bytes(t)
    if have is None or need <= have[0]:
        return

    key = "target.weights" if "MXFP4" in how else "target.dtype"
    raise InputError(
        f"{key}: transformers would hold {t.model} as {how}: {need / 1e9:.1f} GB, and {have[1]} has "
        f"{have[0] / 1e9:.1f} GB; {fix}"
    )


def load_recipe_target(t, fix: str | None = None):
    """load_target with every key of a recipe's `target` section (recipes/schema.TargetSection); with `fix`,
    a target that cannot fit the devices it would use is refused first (check_fits)."""
    if fix is not None:
        check_fits(t, fix)
    return load_target(
        t.model,
        t.dtype,
        t.device,
        t.trust_remote_code,
        t.device_map,
        t.max_memory,
        t.offload_folder,
        t.weights,
    )


def _device(d: str):
    """A recipe's device name -> accelerate's: GPU indices as ints, "cuda:N" -> N, cpu/disk as they are."""
    if d.isdigit():
        return int(d)
    return int(d[5:]) if d.startswith("cuda:") else d


def placement_kwargs(device_map, max_memory=None, offload_folder=None) -> dict:
    """The recipe's placement -> `from_pretrained` keyword arguments."""
    kw = {
        "device_map": device_map
        if isinstance(device_map, str)
        else {name: _device(d) for name, d in device_map.items()}
    }
    if max_memory:
        kw["max_memory"] = {_device(d): size for d, size in max_memory.items()}
    if offload_folder:
        kw["offload_folder"] = offload_folder
    return kw


def describe_placement(model: nn.Module, device_map) -> str:
    """Which decoder layers sit where, e.g. "device_map=auto: layers 0-17 on 0, layers 18-35 on 1"."""
    placed = getattr(model, "hf_device_map", {}) or {}
    names = {id(m): n for n, m in model.named_modules()}

    def where(name: str) -> str:  # the entry of the map that covers module `name` (itself or a parent)
        best = max(
            (k for k in placed if k == "" or name == k or name.startswith(k + ".")), key=len, default=None
        )
        return str(placed[best]) if best is not None else "?"

    runs: list[list] = []  # [device, first layer, last layer]
    for i, layer in enumerate(decoder_layers(model)):
        d = where(names[id(layer)])
        if runs and runs[-1][0] == d:
            runs[-1][2] = i
        else:
            runs.append([d, i, i])
    spans = ", ".join(f"layers {a}-{b} on {d}" if a != b else f"layer {a} on {d}" for d, a, b in runs)
    how = device_map if isinstance(device_map, str) else "explicit"
    return f"device_map={how}: {spans}; lm_head on {where(names[id(model.get_output_embeddings())])}"


def load_target_config(name: str, trust_remote_code: bool = False, key: str = "target.model"):
    """The model's config; a model that is not there fails with one eyas error naming `key` (model_errors)."""
    from transformers import AutoConfig

    path = resolve_path(name)
    with model_errors(name, key):
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)


def refuse_vllm_mxfp4(t, key: str) -> None:
    """Before vLLM starts: an InputError naming `key` (data.backend / capture.backend) where the recipe's
    target section `t` stores MXFP4 experts that vLLM cannot run on this machine (vllm_env.py says)."""

    mxfp4 = stored_as_mxfp4(load_target_config(t.model, t.trust_remote_code))
    refuse_mxfp4_without_kernels(key, t.model, mxfp4)


def context_length(t) -> int:
    """The longest context the recipe's target section `t` takes (its config's max_position_embeddings)."""
    cfg = text_config(load_target_config(t.model, t.trust_remote_code))
    return int(getattr(cfg, "max_position_embeddings", None) or 2**31 - 1)


def text_config(cfg):
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layer list of a HF causal LM (model.model.layers for gpt-oss, llama, qwen…)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    for attr in ("layers", "h", "blocks"):
        layers = getattr(base, attr, None)
        if isinstance(layers, nn.ModuleList):
            return layers
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")


class StopForward(Exception):
    """Raised by a tap with `stop_at_final` once the final state is recorded: the lm_head matmul
    and the (B, T, V) logits (6.6 GB in bf16 for gpt-oss at B=8, T=2048) are never computed."""


class HiddenStateTap:
    """Forward hooks that record aux states (inputs of decoder layers `layer_ids`; id N: the output of
    the last layer, before the final norm) and the final state (input of the output embedding) on
    each forward. No `output_hidden_states`."""

    def __init__(self, model: nn.Module, layer_ids: list[int], stop_at_final: bool = False):
        layers = decoder_layers(model)
        n = len(layers)
        for i in layer_ids:
            if not 0 <= i <= n:
                raise ValueError(
                    f"aux layer id {i} out of range for a target with {n} layers (vLLM convention: "
                    f"id k = input of decoder layer k, id {n} = output of the last layer before the "
                    f"final norm; ids run 0..{n})"
                )
        self.layer_ids = list(layer_ids)
        self._aux: dict[int, torch.Tensor] = {}
        self.final: torch.Tensor | None = None
        self.stop_at_final = stop_at_final
        self._handles = [
            layers[i].register_forward_pre_hook(self._layer_hook(i), with_kwargs=True)
            for i in layer_ids
            if i < n
        ]
        if n in layer_ids:
            self._handles.append(layers[n - 1].register_forward_hook(self._last_layer_hook(n)))
        self._handles.append(model.get_output_embeddings().register_forward_pre_hook(self._final_hook))

    def _layer_hook(self, i):
        def hook(module, args, kwargs):
            self._aux[i] = args[0] if args else kwargs["hidden_states"]

        return hook

    def _last_layer_hook(self, n):
        def hook(module, args, output):  # decoder layers return the hidden states, alone or first of a tuple
            self._aux[n] = output[0] if isinstance(output, (tuple, list)) else output

        return hook

    def _final_hook(self, module, args):
        self.final = args[0]
        if self.stop_at_final:
            raise StopForward

    @property
    def aux(self) -> torch.Tensor:
        """(B, T, n_aux * H), concatenated in `layer_ids` order (what the draft's fc takes), on the device
        of the first (layers placed on several devices hand their inputs over on different ones)."""
        first = self._aux[self.layer_ids[0]].device
        return torch.cat([self._aux[i].to(first) for i in self.layer_ids], dim=-1)

    def clear(self) -> None:
        """Drop the recorded states (they would otherwise live until the next forward)."""
        self._aux, self.final = {}, None

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


@contextmanager
def tapped(model: nn.Module, layer_ids: list[int]):
    tap = HiddenStateTap(model, layer_ids)
    try:
        yield tap
    finally:
        tap.remove()


def load_head_weights(name: str, trust_remote_code: bool = False) -> dict[str, torch.Tensor]:
    """The target's input embedding and output embedding (lm_head) weights, read from its
    safetensors files alone, without instantiating the model (120B parameters stay on disk).

    Parameter names come from the model class built on the meta device, so this works for
    any architecture, tied embeddings included. -> {"embed": (V, H), "lm_head": (V, H)}.
    """
    meta, weight_map, read = _checkpoint(name, trust_remote_code)
    # the modules' own names: a tied lm_head shares its Parameter with the embedding, not its module
    modules = {id(m): n for n, m in meta.named_modules()}
    emb, out = meta.get_input_embeddings(), meta.get_output_embeddings()
    emb_name, out_name = modules[id(emb)] + ".weight", modules[id(out)] + ".weight"
    tied = out.weight is emb.weight
    embed = read(emb_name)
    lm_head = embed if (tied or out_name not in weight_map) else read(out_name)
    return {"embed": embed, "lm_head": lm_head}


def load_final_norm(name: str, trust_remote_code: bool = False) -> nn.Module:
    """The target's final norm (the module between the last decoder layer and the lm_head), as the
    model class defines it, with its weights read from the checkpoint alone (float32, CPU, eval)."""
    meta, _, read = _checkpoint(name, trust_remote_code)
    norm = getattr(meta.base_model, "norm", None)
    if not isinstance(norm, nn.Module):
        raise ValueError(f"{name}: no final norm at base_model.norm in {type(meta).__name__}")
    prefix = {id(m): n for n, m in meta.named_modules()}[id(norm)]
    norm = norm.to_empty(device="cpu").float().eval()
    with torch.no_grad():
        for n, p in norm.named_parameters():
            p.copy_(read(f"{prefix}.{n}").float())
    return norm


def _checkpoint(name: str, trust_remote_code: bool):
    """-> (the model class built on the meta device, {tensor name: file}, read(tensor name))."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    path = Path(resolve_path(name))
    if not path.is_dir():
        from huggingface_hub import snapshot_download

        with model_errors(name):
            path = Path(snapshot_download(str(name), allow_patterns=["*.json", "*.safetensors"]))
    cfg = load_target_config(str(path), trust_remote_code)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(cfg, trust_remote_code=trust_remote_code)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
    else:
        files = sorted(path.glob("*.safetensors"))
        weight_map = {}
        for f in files:
            with safe_open(f, "pt") as sf:
                weight_map.update({k: f.name for k in sf.keys()})

    def read(n: str) -> torch.Tensor:
        if n not in weight_map:
            raise KeyError(f"{path}: no tensor {n} in the checkpoint")
        with safe_open(path / weight_map[n], "pt") as sf:
            return sf.get_tensor(n)

    return meta, weight_map, read
