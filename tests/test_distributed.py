"""Training on several processes shares the work: 2 CPU processes under torchrun (gloo DDP).

* 2 processes x grad_accum 1 end with the weights of 1 process x grad_accum 2 (the same global
  batch of 2 rows per optimizer step, the same rows in the same steps): fp32, within 2e-6 of each
  tensor's largest weight (all-reduce sums in another order than accumulation does);
* both see every training sequence once per epoch (tokens counted over all ranks), take the
  number of optimizer steps the global batch gives, follow the same LR schedule, and only the main
  process writes the log;
* `accelerate launch` with the shipped recipes/accelerate/ddp.yaml trains exactly as torchrun does;
* with the shipped fsdp2.yaml, zero2.yaml and zero3.yaml (FSDP2, DeepSpeed ZeRO-2/3 over 2 gloo
  processes) training ends with the weights of the 1-process run, within 2e-6 of each tensor's
  largest weight, and the full weights are gathered from the shards into the final checkpoint;
* `capture.mode: online` (the target runs inside training) on 2 processes equals 1 process the same way;
* a 2-process run killed (SIGKILL: the launcher and each worker) after a state save resumes to the
  bit-identical weights of an uninterrupted 2-process run: DDP, and FSDP2 and ZeRO-3, whose saved
  state is sharded;
* SIGTERM to torchrun: both ranks stop at the same step and save it; the re-run resumes to the same weights;
* sequence parallelism (train.sequence_parallel=2) on 2 processes and on 2 x 2 equals 1 process (EAGLE-3
  and DFlash; P-EAGLE on 2), and a killed run of it resumes to the same weights (a row over P processes
  against one process: test_sequence_parallel).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from data_fixtures import make_tiny_target, tiny_recipe, write_prompts
from safetensors.torch import load_file

from eyas.infra import layout
from eyas.pipeline import run_all
from eyas.recipes.load import load_recipe


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    target = make_tiny_target(root / "target", num_layers=4)
    prompts = write_prompts(root / "prompts.jsonl", 30)
    raw = tiny_recipe(
        target,
        prompts,
        train={
            "max_steps": None,
            "epochs": 2,
            "batch_size": 1,
            "lr": 3e-3,
            "warmup_ratio": 0.2,
            "val_fraction": 0.05,
        },
    )
    recipe_path = root / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(raw))
    run_all(
        load_recipe(recipe_path),
        root / "base",
        stages=("prompts", "regenerate", "capture", "vocab"),
        progress=False,
    )
    return root, recipe_path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONFIGS = Path(__file__).parents[1] / "recipes" / "accelerate"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# on CPU: DDP and FSDP2 configs run over gloo with ACCELERATE_USE_CPU; DeepSpeed must not have it
CPU_ENV = {
    "ddp": {"ACCELERATE_USE_CPU": "true"},
    "fsdp2": {"ACCELERATE_USE_CPU": "true"},
    "zero2": {},
    "zero3": {},
}


def command(recipe, run, nproc, *overrides, config=None):
    """torchrun (`config` None) or `accelerate launch --config_file recipes/accelerate/<config>.yaml`."""
    if config:
        launch = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(CONFIGS / f"{config}.yaml"),
            "--num_processes",
            str(nproc),
            "--main_process_ip",
            "127.0.0.1",
            "--main_process_port",
            str(free_port()),
        ]
    elif nproc > 1:
        launch = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
        ]
    else:
        launch = [sys.executable]
    return [*launch, "-m", "eyas.train", str(recipe), "--out", str(run), "--no-progress", *overrides]


# the runs this module has trained, by their launch: a test that needs a run another test made (the 1-process
# references, the uninterrupted sharded runs) reads it rather than launching processes that find it done
TRAINED: dict[tuple, Path] = {}


def train(base, name, nproc, *overrides, config=None, source="base"):
    root, recipe = base
    key = (str(root), name, nproc, overrides, config, source)
    if key in TRAINED:
        return TRAINED[key]
    run = root / name
    if not run.exists():
        shutil.copytree(root / source, run)
    if nproc == 1 and not config:  # the same `eyas.train` in this worker, on one torch thread as the launched
        from eyas.train.__main__ import main  # ones: a process of its own spends ~8 s of its ~12 importing

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            rc = main([*command(recipe, run, 1, *overrides)[3:]])
        finally:
            torch.set_num_threads(threads)
        assert rc == 0, f"eyas.train {name} exited {rc}: its `eyas: error:` line is in the captured stderr"
    else:
        r = subprocess.run(
            command(recipe, run, nproc, *overrides, config=config),
            env={**ENV, **CPU_ENV.get(config, {})},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr[-3000:]
    TRAINED[key] = run
    return run


def weights(run):
    return load_file(str(run / "train" / "checkpoint-final" / "model.safetensors"))


@pytest.fixture(scope="module")
def two_procs(base):
    return train(base, "ddp", 2, "train.grad_accum=1")


@pytest.fixture(scope="module")
def one_proc(base):
    return train(base, "single", 1, "train.grad_accum=2")


def assert_close_weights(a, b, rel=2e-6):
    assert a.keys() == b.keys()
    worst = max(
        ((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-30)).item()
        for k in a
        if a[k].is_floating_point()
    )
    print(f"weights: largest difference {worst:.2e} of a tensor's largest (tolerance {rel:.0e})")
    for k in a:
        if a[k].is_floating_point():
            assert (a[k] - b[k]).abs().max().item() <= rel * b[k].abs().max().item(), k
        else:
            assert torch.equal(a[k], b[k]), k


def test_ddp_equals_one_process_with_the_same_global_batch(base, two_procs, one_proc):
    one = one_proc
    d2, d1 = layout.read_done(two_procs, "train"), layout.read_done(one, "train")
    assert d2["num_processes"] == 2 and d1["num_processes"] == 1
    assert d2["global_batch_rows"] == d1["global_batch_rows"] == 2
    n_seq = sum(
        s["num_sequences"] for s in json.loads((one / "capture" / "index.json").read_text())["shards"]
    )
    n_train = n_seq - d1["val_sequences"]
    assert d2["steps"] == d1["steps"] == 2 * ((n_train + 1) // 2)  # 2 epochs of ceil(n / global batch) steps
    assert (
        d2["tokens_seen"] == d1["tokens_seen"] > 0
    )  # every training sequence, once per epoch, over all ranks
    log2 = [json.loads(x) for x in (two_procs / "train" / "log.jsonl").read_text().splitlines()]
    log1 = [json.loads(x) for x in (one / "train" / "log.jsonl").read_text().splitlines()]
    steps2 = [e["step"] for e in log2 if "loss" in e]
    assert steps2 == list(range(1, d2["steps"] + 1))  # one line per step: only the main process writes
    assert [e["lr"] for e in log2 if "lr" in e] == pytest.approx(
        [e["lr"] for e in log1 if "lr" in e], rel=1e-12
    )
    train_losses = [e["loss"] for e in log1 if "loss" in e]
    assert sum(train_losses[-5:]) / 5 < sum(train_losses[:5]) / 5 - 0.1  # it trained
    assert_close_weights(weights(two_procs), weights(one))


def online_base(base) -> Path:
    """The base run with capture.mode online (nothing stored: the target runs inside training)."""
    root, recipe = base
    src = root / "online-base"
    if not src.exists():
        shutil.copytree(root / "base", src, ignore=shutil.ignore_patterns("capture"))
        run_all(load_recipe(recipe, ["capture.mode=online"]), src, stages=("capture",), progress=False)
    return src


def test_online_mode_under_ddp_equals_one_process(base):
    """`capture.mode: online` on 2 processes: each runs the target on its own micro-batches; the weights equal
    a 1-process online run's with the same global batch (within 2e-6, as DDP), and nothing is stored."""
    src = online_base(base)
    assert not list((src / "capture").glob("*.safetensors"))
    two = train(base, "online-ddp", 2, "train.grad_accum=1", "capture.mode=online", source="online-base")
    one = train(base, "online-single", 1, "train.grad_accum=2", "capture.mode=online", source="online-base")
    assert layout.read_done(two, "train")["num_processes"] == 2
    assert layout.read_done(two, "train")["tokens_seen"] == layout.read_done(one, "train")["tokens_seen"] > 0
    assert_close_weights(weights(two), weights(one))


SHARDED = [("fsdp2", "pytorch_model_fsdp_0"), ("zero2", "pytorch_model"), ("zero3", "pytorch_model")]


@pytest.mark.parametrize("config,state_dir", SHARDED, ids=[c for c, _ in SHARDED])
def test_sharded_training_equals_one_process(base, one_proc, config, state_dir, request):
    """FSDP2 / DeepSpeed through the shipped accelerate configs: the same steps, tokens and schedule as the
    1-process run, the full weights gathered into the final checkpoint, the saved state sharded."""
    if config.startswith("zero"):
        request.getfixturevalue("deepspeed")  # skipped without it, but in CI
    run = train(base, config, 2, "train.grad_accum=1", config=config)
    done, ref = layout.read_done(run, "train"), layout.read_done(one_proc, "train")
    assert done["num_processes"] == 2
    assert (done["steps"], done["tokens_seen"]) == (ref["steps"], ref["tokens_seen"])
    assert done["last"]["lr"] == pytest.approx(ref["last"]["lr"], rel=1e-12)
    assert (run / "train" / "state" / state_dir).is_dir()  # this launcher's own (sharded) state layout
    # ZeRO-3 holds the lm_head partitioned outside its module's forward, so its loss runs through the
    # modules and autograd (train/ttt.step_cross_entropy), not fused: the same sums in another order
    # (measured 3.8e-6 after the run on an earlier session's machine, 1.04e-5 on an Intel Xeon with AMX, the
    # same on every run; <= 5e-7 for the fused launchers)
    assert_close_weights(weights(run), weights(one_proc), rel=2e-5 if config == "zero3" else 2e-6)


@pytest.mark.parametrize("config", [None, "fsdp2", "zero3"], ids=["ddp", "fsdp2", "zero3"])
def test_peagle_with_cod_sampling_trains_alike_on_every_launcher(base, config, request):
    """P-EAGLE (draft.kind peagle) with COD sampling on 2 processes (DDP, FSDP2, ZeRO-3) ends at the weights
    of one process with the same global batch: each row draws its anchors from its own tokens and the epoch
    (train/grids.py row_seeds), wherever it is dealt. Within 2e-6; ZeRO-3 runs its loss unfused, through
    the modules (as above), over five depths here: 3.0e-5 on lm_head measured on the 2-core EPYC, so 1e-4
    (different COD draws would part the weights by the updates themselves, ~1e-2)."""
    if config == "zero3":
        request.getfixturevalue("deepspeed")
    peagle = ("draft.kind=peagle", "train.cod_ratio=0.5", "train.cod_floor=0.3")
    one = train(base, "peagle-single", 1, "train.grad_accum=2", *peagle)
    run = train(base, f"peagle-{config or 'ddp'}", 2, "train.grad_accum=1", *peagle, config=config)
    assert layout.read_done(run, "train")["num_processes"] == 2
    assert "mask_hidden.weight" in weights(one)
    assert_close_weights(weights(run), weights(one), rel=1e-4 if config == "zero3" else 2e-6)


@pytest.mark.parametrize("config", [None, "fsdp2", "zero3"], ids=["ddp", "fsdp2", "zero3"])
def test_dflash_with_random_anchors_trains_alike_on_every_launcher(base, config, request):
    """DFlash (draft.kind dflash, 2 layers, block 4, 6 random anchors a row) on 2 processes (DDP, FSDP2,
    ZeRO-3) ends at the weights of one process with the same global batch: each row draws its anchors from
    its own tokens and the epoch (train/grids.py row_seeds), wherever it is dealt. Within 2e-6 (ZeRO-3, its
    loss unfused through the modules: 1e-4)."""
    if config == "zero3":
        request.getfixturevalue("deepspeed")
    dflash = ("draft.kind=dflash", "draft.num_layers=2", "train.max_anchors=6")
    one = train(base, "dflash-single", 1, "train.grad_accum=2", *dflash)
    run = train(base, f"dflash-{config or 'ddp'}", 2, "train.grad_accum=1", *dflash, config=config)
    assert layout.read_done(run, "train")["num_processes"] == 2
    assert "layers.1.self_attn.q_norm.weight" in weights(one)
    assert_close_weights(weights(run), weights(one), rel=1e-4 if config == "zero3" else 2e-6)


def test_peagle_sequence_parallel_equals_one_process(deepspeed, base):
    """P-EAGLE with COD sampling, each row over 2 processes (train.sequence_parallel=2, grad_accum 2): every
    rank draws the whole row's anchors (its tokens are whole there) and runs its shard's, the depths' grids
    cross the ranks as TTT's steps do (kinds/peagle cod_forward). The steps, logged losses (within 1e-5),
    validation counts and replayed tau of one process, and its weights within 1e-4 of each tensor's largest
    (fp32; the all-to-all and all-reduce sum in another order, and each rank's lm_head runs over its own
    shard's kept anchors, gathered: other matmul shapes than one process's. Measured: the losses agree to
    5e-8 over the 26 steps and the weights to 1.9e-5, a few elements of the lm_head where AdamW divides a
    near-zero gradient by its own size; 1.2e-6 with the whole grid through the lm_head. As DFlash's below.)"""
    peagle = ("draft.kind=peagle", "train.cod_ratio=0.5", "train.cod_floor=0.3")
    one = train(base, "peagle-single", 1, "train.grad_accum=2", *peagle)
    run = train(base, "peagle-sp2", 2, "train.grad_accum=2", "train.sequence_parallel=2", *peagle)
    assert_sp_run_is_one_process(run, one, rel=1e-4)


def test_dflash_sequence_parallel_equals_one_process(base):
    """DFlash with random anchors (2 layers, block 4, 6 anchors a row), each row over 2 processes
    (train.sequence_parallel=2) on 2 processes (grad_accum 2) and on 2 x 2 (grad_accum 1; no DeepSpeed
    needed): every rank draws the whole row's anchors and runs its shard's blocks against the whole row's
    context, gathered once (train/sequence_parallel.py all_tokens: its backward sums each shard's gradient
    over the group); the teacher's halo covers the blocks of the shard's last anchors. As P-EAGLE's above:
    one process's steps, losses, validation and weights, these within 1e-4 of each tensor's largest: one
    step's gradients agree within 3.2e-7 (test_sequence_parallel.py: a rank's blocks go through SDPA in
    other chunks, so sums run in another order), and over the run's AdamW steps that grew to 1.1e-5
    (layers.0.mlp.down_proj, measured on the 2-core EPYC); without the context's cross-shard gradient the
    logged losses part, and fc by 0.53."""
    dflash = ("draft.kind=dflash", "draft.num_layers=2", "train.max_anchors=6")
    one = train(base, "dflash-single", 1, "train.grad_accum=2", *dflash)
    for nproc, accum in ((2, 2), (4, 1)):
        sp = ("train.sequence_parallel=2", f"train.grad_accum={accum}")
        run = train(base, f"dflash-sp2-{nproc}", nproc, *sp, *dflash)
        assert_sp_run_is_one_process(run, one, rel=1e-4, nproc=nproc)


def assert_sp_run_is_one_process(run, one, rel=2e-6, nproc=2):
    """A train.sequence_parallel=2 run on `nproc` processes against one process with the same global batch:
    the steps, the logged losses (D = 1: the main process's rows are the step's; within 1e-5), validation's
    positions, accuracy and replayed tau, and the weights within `rel` of each tensor's largest (fp32; the
    collectives sum in another order)."""
    ref, done = (layout.read_done(r, "train") for r in (one, run))
    assert (done["num_processes"], done["sequence_parallel"], done["steps"]) == (nproc, 2, ref["steps"])
    losses = [
        [
            e["loss"]
            for e in map(json.loads, (r / "train" / "log.jsonl").read_text().splitlines())
            if "loss" in e
        ]
        for r in (run, one)
    ]
    assert len(losses[0]) == ref["steps"]
    assert nproc > 2 or losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert done["validation"]["positions"] == ref["validation"]["positions"] > 0
    assert done["validation"]["acc"] == pytest.approx(ref["validation"]["acc"], abs=1e-9)
    assert done["validation"]["replayed_tau"] == pytest.approx(ref["validation"]["replayed_tau"], rel=1e-6)
    assert_close_weights(weights(run), weights(one), rel=rel)


def test_accelerate_launch_with_the_shipped_ddp_config(base, two_procs):
    """`accelerate launch --config_file recipes/accelerate/ddp.yaml` (CPU: ACCELERATE_USE_CPU=true) runs the
    same 2-process DDP training as torchrun: bit-identical weights; rank 0 records the stage's time and memory
    (RUN/stage_costs.json) as `eyas run` does."""
    run = train(base, "accelerate-ddp", 2, "train.grad_accum=1", config="ddp")
    assert layout.read_done(run, "train")["num_processes"] == 2
    cost = json.loads((run / layout.STAGE_COSTS).read_text())["train"]
    assert cost["wall_s"] > 0 and 50e6 < cost["anon_bytes"] <= cost["peak_bytes"]
    a, b = weights(run), weights(two_procs)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def kill_launch(proc: subprocess.Popen) -> None:
    """SIGKILL a launcher and every worker it started. torchrun starts each worker in a session of its own
    (torch.distributed.elastic's SubprocessHandler: start_new_session), so killing the launcher's process
    group leaves the workers training to the end; each is killed by pid, and waited for."""
    import psutil

    workers = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGKILL)
    for w in workers:
        try:
            w.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    psutil.wait_procs(workers, timeout=60)
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)


def kill_and_resume(base, name: str, over: tuple, config=None, total=None, refusals=()):
    """A 2-process run SIGKILLed (torchrun and both workers) after its first state save, then re-run: it
    resumes from the saved step and logs every step once -> the run. `refusals`: (processes, overrides, the
    error's changes) that a resume must refuse first (train/state.py)."""
    root, recipe = base
    run = root / name
    shutil.copytree(root / "base", run)
    proc = subprocess.Popen(
        command(recipe, run, 2, *over, config=config),
        env={**ENV, **CPU_ENV.get(config, {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    step_file = run / "train" / "state" / "step.json"
    deadline = time.time() + 300
    while not step_file.is_file() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    kill_launch(proc)  # torchrun and both workers, mid-run
    assert not layout.is_done(run, "train"), "the run finished before it could be killed"
    state = json.loads(step_file.read_text())
    saved = state["step"]
    assert 2 <= saved < total
    for nproc, changed, changes in refusals:
        assert_resume_refused(base, run, saved, nproc, [*over, *changed], changes)
    train(base, name, 2, *over, config=config)  # resumes from the saved step
    done = layout.read_done(run, "train")  # tokens (under SP, each group's first rank's) and seconds add up
    assert done["tokens_this_run"] == done["tokens_seen"] - state["tokens"] > 0
    assert done["run_wall_s"] > done["wall_s"] and done["run_loop_s"] > done["loop_s"]
    log = [json.loads(x) for x in (run / "train" / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log if "loss" in e] == list(range(1, total + 1))  # steps redone: logged once
    return run


def assert_resume_refused(base, run, saved, nproc, over, changes):
    """Resuming a killed run's state on `nproc` processes with `over`: one `eyas: error:` line naming the
    `changes`, the saved state untouched."""
    root, recipe = base
    state = run / "train" / "state"
    before = {p.name: p.stat().st_mtime_ns for p in state.iterdir()}
    r = subprocess.run(
        command(recipe, run, nproc, *over), env=ENV, capture_output=True, text=True, timeout=600
    )
    lines = {x for x in r.stderr.splitlines() if x.startswith("eyas: error:")}  # (each process prints it)
    assert r.returncode != 0 and len(lines) == 1, r.stderr[-3000:]
    assert f"saved at step {saved} with another layout ({changes})" in lines.pop()
    assert {p.name: p.stat().st_mtime_ns for p in state.iterdir()} == before


@pytest.mark.parametrize("config", [None, "fsdp2", "zero3"], ids=["ddp", "fsdp2", "zero3"])
def test_killed_two_process_run_resumes_to_the_same_weights(base, two_procs, config, request):
    if config == "zero3":
        request.getfixturevalue("deepspeed")  # skipped without it, but in CI
    over = ("train.grad_accum=1", "train.save_every=2")
    total = layout.read_done(two_procs, "train")["steps"]
    # DDP: the same global batch on 1 process (accumulating 2) deals rows otherwise: refused
    refusals = (
        [(1, ["train.grad_accum=2"], "num_processes 2 -> 1; train.grad_accum 1 -> 2")] if not config else []
    )
    run = kill_and_resume(base, f"killed-{config or 'ddp'}", over, config, total, refusals)
    # against the uninterrupted run of the same launcher (DDP: two_procs; the others ran in the test above,
    # or run here when this test runs alone)
    uninterrupted = (
        two_procs if config is None else train(base, config, 2, "train.grad_accum=1", config=config)
    )
    a, b = weights(run), weights(uninterrupted)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_online_sequence_parallel_equals_one_process(deepspeed, base):
    """capture.mode online with train.sequence_parallel=2: each process runs the target over the whole row and
    keeps its shard; the weights equal a 1-process online run's (within 2e-6)."""
    online_base(base)
    over = ("train.grad_accum=2", "capture.mode=online")
    sp = train(base, "online-sp2", 2, *over, "train.sequence_parallel=2", source="online-base")
    one = train(base, "online-single", 1, *over, source="online-base")
    assert layout.read_done(sp, "train")["tokens_seen"] == layout.read_done(one, "train")["tokens_seen"] > 0
    assert_close_weights(weights(sp), weights(one))


def test_killed_sequence_parallel_run_resumes_to_the_same_weights(deepspeed, base, one_proc):
    """train.sequence_parallel=2 on 2 processes, killed after a save and re-run: the bit-identical weights of
    the uninterrupted sequence-parallel run."""
    over = ("train.grad_accum=2", "train.sequence_parallel=2", "train.save_every=2")
    total = layout.read_done(one_proc, "train")["steps"]
    # each row over 2 processes, resumed with each process on its own rows (the same global batch): refused
    refusals = [
        (
            2,
            ["train.sequence_parallel=1", "train.grad_accum=1"],
            "train.grad_accum 2 -> 1; train.sequence_parallel 2 -> 1",
        )
    ]
    run = kill_and_resume(base, "killed-sp2", over, None, total, refusals)
    a, b = weights(run), weights(train(base, "sp2-2", 2, *over[:2]))
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_sigterm_to_torchrun_saves_one_step_on_both_ranks(base, two_procs):
    """SIGTERM to torchrun (a preempted job): it passes the signal to both workers, which agree on the step to
    stop at, save the state and exit; the re-run resumes there to the weights of the uninterrupted run."""
    root, recipe = base
    run = root / "sigterm-ddp"
    shutil.copytree(root / "base", run)
    over = ("train.grad_accum=1", "train.save_every=0")
    proc = subprocess.Popen(
        command(recipe, run, 2, *over), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    log = run / "train" / "log.jsonl"
    deadline = time.time() + 300
    while not (log.is_file() and len(log.read_text().splitlines()) >= 2) and time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    saved = json.loads((run / "train" / "state" / "step.json").read_text())["step"]
    total = layout.read_done(two_procs, "train")["steps"]
    assert 2 <= saved < total and not layout.is_done(run, "train")
    assert (
        f"eyas: error: interrupted by SIGTERM: the training state at step {saved}/{total} is saved in" in err
    )
    train(base, "sigterm-ddp", 2, *over)  # resumes from the saved step
    a, b = weights(run), weights(two_procs)
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("rows,b,a,world", [(35, 1, 1, 2), (35, 2, 3, 2), (7, 2, 1, 4), (64, 4, 2, 4)])
def test_micro_batches_cover_every_row_once_per_epoch(rows, b, a, world):
    from eyas.train.schedule import epoch_micro_batches, updates_per_epoch

    per = [epoch_micro_batches(rows, b, a, world, r, seed=3, epoch=1) for r in range(world)]
    steps = updates_per_epoch(rows, b, a, world)
    assert all(len(p) == steps * a for p in per)  # every rank takes the same number of steps
    seen = sorted(i for p in per for mb in p for i in mb)
    assert seen == list(range(rows))  # once each; the rest are empty fillers
    # optimizer step s on N ranks trains the rows one process with grad_accum N*a trains at step s
    one = epoch_micro_batches(rows, b, a * world, 1, 0, seed=3, epoch=1)
    for s in range(steps):
        dealt = sorted(i for p in per for mb in p[s * a : (s + 1) * a] for i in mb)
        assert dealt == sorted(i for mb in one[s * a * world : (s + 1) * a * world] for i in mb)
    assert epoch_micro_batches(rows, b, a, world, 0, seed=3, epoch=2) != per[0] or rows <= b


def test_sequence_parallel_equals_one_process(deepspeed, base, one_proc):
    """train.sequence_parallel=2 (each row over 2 processes, train/sequence_parallel.py), on 2 processes
    (P = 2, D = 1) with grad_accum 2 and on 4 (P = 2 x D = 2) with grad_accum 1: the steps, tokens and
    validation of the 1-process run with the same global batch, its logged losses (D = 1; within 1e-5), and
    its weights within 2e-6 of each tensor's largest (fp32; the all-to-all and all-reduce sum in another
    order)."""
    ref = layout.read_done(one_proc, "train")
    ref_log = [json.loads(x) for x in (one_proc / "train" / "log.jsonl").read_text().splitlines()]
    for nproc, accum in ((2, 2), (4, 1)):
        run = train(base, f"sp2-{nproc}", nproc, f"train.grad_accum={accum}", "train.sequence_parallel=2")
        done = layout.read_done(run, "train")
        assert (done["num_processes"], done["sequence_parallel"]) == (nproc, 2)
        assert (done["steps"], done["tokens_seen"], done["global_batch_rows"]) == (
            ref["steps"],
            ref["tokens_seen"],
            ref["global_batch_rows"],
        )
        log = [json.loads(x) for x in (run / "train" / "log.jsonl").read_text().splitlines()]
        losses = [[e["loss"] for e in x if "loss" in e] for x in (log, ref_log)]
        assert len(losses[0]) == ref["steps"]
        if nproc == 2:  # the main process's rows are the whole step's (D = 1)
            assert losses[0] == pytest.approx(losses[1], rel=1e-5)
        assert done["validation"]["positions"] == ref["validation"]["positions"] > 0
        assert done["validation"]["replayed_tau"] == pytest.approx(
            ref["validation"]["replayed_tau"], rel=1e-6
        )
        assert_close_weights(weights(run), weights(one_proc))


def test_muon_under_ddp_and_sequence_parallel_equals_one_process(deepspeed, base):
    """train.optimizer=muon (the gpt-oss recipes' optimizer) orthogonalizes each whole matrix after the
    gradients are reduced: 2 DDP processes (grad_accum 1) and a row over 2 processes (sequence_parallel 2,
    grad_accum 2) end with the weights of 1 process with the same global batch. Muon's bf16 orthogonalization
    (float32 on a CPU without bf16) turns fp32 sums taken in another order (2e-6 of a tensor's largest weight
    under AdamW, above) into larger differences: measured on an AVX512-BF16 CPU, DDP 0 and sequence
    parallelism at most 1.5% of each tensor's largest weight (on an AVX2-only one, in float32: 0 and 1.7e-6).
    Held within 5%, where a run with half the global batch (1 process, grad_accum 1: other rows in each
    step, twice the steps) ends 13-27% away in every matrix (AVX2 only: 17.4% or more): more than 10% is
    asserted, so the 5% tells a different batch apart."""
    muon = "train.optimizer=muon"
    ref = weights(train(base, "muon-single", 1, "train.grad_accum=2", muon))
    sp2 = ["train.grad_accum=2", "train.sequence_parallel=2"]
    for name, over in (("muon-ddp", ["train.grad_accum=1"]), ("muon-sp2", sp2)):
        run = train(base, name, 2, muon, *over)
        assert layout.read_done(run, "train")["num_processes"] == 2
        assert_close_weights(weights(run), ref, rel=0.05)
    half = weights(train(base, "muon-half", 1, "train.grad_accum=1", muon))
    matrices = [k for k in ref if ref[k].ndim == 2 and "embed" not in k]
    moved = {k: ((half[k] - ref[k]).abs().max() / ref[k].abs().max()).item() for k in matrices}
    print(f"half the global batch: every matrix {min(moved.values()):.3f} or more away")
    assert min(moved.values()) > 0.1, moved
