"""The whole pipeline on a tiny random gpt-oss target: report fields, and crash + resume."""

import json
import re
import time

import pytest
import torch
import yaml
from data_fixtures import make_tiny_target, tiny_recipe, write_prompts
from safetensors.torch import load_file

from eyas.infra import io, layout
from eyas.pipeline import STAGE_ORDER, prepare_run, run_all
from eyas.recipes.load import load_recipe
from eyas.recipes.schema import RecipeError
from eyas.train.ttt import simulated_tau


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipe")
    target = make_tiny_target(root / "target", num_layers=4)
    prompts = write_prompts(root / "prompts.jsonl", 24)
    return root, target, prompts


def recipe_for(target, prompts, **over):
    return load_recipe(tiny_recipe(target, prompts, **over))


@pytest.fixture(scope="module")
def full_run(setup):
    root, target, prompts = setup
    run = root / "run-full"
    run_all(recipe_for(target, prompts), run, progress=False)
    return run


def test_full_run_report(full_run):
    run = full_run
    report = json.loads((run / "report.json").read_text())
    for key in (
        "acceptance_length",
        "k",
        "per_position_acceptance",
        "lossless",
        "num_prompts",
        "tokens_per_second",
        "target_entropy",
        "stage_times",
    ):
        assert key in report, key
    assert report["k"] == 3 and len(report["per_position_acceptance"]) == 3
    assert report["num_prompts"] == 4
    assert report["lossless"] is True
    # No tau floor on a random tiny target: no draft learns one in seconds. This recipe's draft and an
    # untrained one (lr 1e-12) both measured 1.049 at k = 3, and 300 steps at lr 1e-2 also 1.049. The floors
    # that a weakened draft fails are the demo's (tests/test_demo_e2e.py) and the real model's
    # (tests/test_real_model.py); here the counts must add up exactly.
    # tau (vLLM's definition) is exactly 1 + the sum of the per-position rates; tokens per forward is
    # that less what eos / max_tokens cut off: the bonus tokens and the accepted drafts after the cut
    main = report["results"][0]
    assert report["acceptance_length"] == pytest.approx(1 + sum(report["per_position_acceptance"]), abs=1e-9)
    assert main["tokens_per_forward"] == pytest.approx(
        report["acceptance_length"]
        - (main["cut_verifications"] + main["cut_drafts"]) / main["target_forwards"],
        abs=1e-9,
    )
    assert set(report["tokens_per_second"]) == {"speculative", "baseline"}
    assert report["target_entropy"] > 0
    assert set(report["stage_times"]) == set(STAGE_ORDER)
    assert (run / "report.md").read_text().startswith("# eyas evaluation report")
    # training's validation: held-out captured sequences, simulated tau for every k <= ttt_steps,
    # set next to the loop's measured tau at the eval's k
    val = layout.read_done(run, "train")["validation"]
    assert layout.read_done(run, "train")["val_sequences"] == 1 and val["positions"] > 0
    tau, run_ = [], 1.0
    for a in val["cond_acc"]:
        run_ *= a
        tau.append(1 + (tau[-1] - 1 if tau else 0) + run_)
    assert val["simulated_tau"] == pytest.approx(tau, abs=1e-12) and len(tau) == 3
    # at T = 1 (train/ttt.py): the same product over the sampled chains' acceptance, each a probability
    assert val["simulated_tau_t1"] == pytest.approx(simulated_tau(val["sampled_cond_acc"]), abs=1e-12)
    assert len(val["simulated_tau_t1"]) == 3 and 0 < val["sampled_cond_acc"][0] < 1
    assert all(0 <= a < 1 for a in val["sampled_cond_acc"])  # 0 where no chain reached the step
    # greedy, the loop's own rounds replayed (train/validation.py): at most k drafts accepted per round
    assert len(val["replayed_tau"]) == 3 and all(
        1 <= t <= 1 + k for k, t in enumerate(val["replayed_tau"], 1)
    )
    assert main["training_replayed_tau"] == val["replayed_tau"][2]
    log = [json.loads(x) for x in (run / "train" / "log.jsonl").read_text().splitlines()]
    assert log[-1] == {"step": 4, "val": val}
    assert (run / "train" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main["k"] == 3 and main["training_simulated_tau"] == val["simulated_tau"][2]
    assert report["training_validation"] == val and "train/curves.png" in report["plots"]
    assert "## Training's estimate vs the serving loop" in (run / "report.md").read_text()
    # the eval prompts were held out: none of them was regenerated for training
    train_ids = {r["id"] for r in io.read_jsonl(run / "prompts" / "train.jsonl")}
    eval_ids = {r["id"] for r in io.read_jsonl(run / "prompts" / "eval.jsonl")}
    assert len(eval_ids) == 4 and not train_ids & eval_ids


def test_crash_then_resume(setup, monkeypatch):
    root, target, prompts = setup
    recipe = recipe_for(target, prompts)
    clean = root / "run-clean"
    run_all(recipe, clean, stages=("prompts", "regenerate", "capture"), progress=False)

    run = root / "run-crash"
    import eyas.data.capture as capture_mod

    real_write = capture_mod.write_shard
    calls = {"n": 0}

    def crash_on_second(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated crash")
        return real_write(*a, **k)

    monkeypatch.setattr(capture_mod, "write_shard", crash_on_second)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_all(recipe, run, stages=("prompts", "regenerate", "capture"), progress=False)
    assert layout.is_done(run, "regenerate") and not layout.is_done(run, "capture")
    assert not list((run / "capture").glob("*.tmp")) and not list((run / "capture").glob(".*tmp"))
    monkeypatch.setattr(capture_mod, "write_shard", real_write)

    # the re-run must not regenerate (generation would fail now) and must finish capture
    import eyas.data.regenerate as regen_mod

    def no_generation(*a, **k):
        raise AssertionError("regenerate ran again")

    monkeypatch.setattr(regen_mod, "generate_batch", no_generation)
    run_all(recipe, run, stages=("prompts", "regenerate", "capture"), progress=False)
    assert layout.is_done(run, "capture")
    a, b = sorted((clean / "capture").glob("shard-*")), sorted((run / "capture").glob("shard-*"))
    assert [p.name for p in a] == [p.name for p in b] and len(a) >= 2
    for pa, pb in zip(a, b):
        ta, tb = load_file(str(pa)), load_file(str(pb))
        assert ta.keys() == tb.keys()
        assert all(torch.equal(ta[k], tb[k]) for k in ta)


def test_changed_recipe_refused_for_finished_stage(setup):
    root, target, prompts = setup
    run = root / "run-change"
    run_all(recipe_for(target, prompts), run, stages=("prompts",), progress=False)
    with pytest.raises(
        RecipeError, match=r"stage 'prompts' is finished with a different recipe \(data.num_eval_prompts"
    ):
        prepare_run(recipe_for(target, prompts, data={"num_eval_prompts": 5}), run)
    prepare_run(recipe_for(target, prompts, eval={"k": 2}), run)  # eval is not finished: fine
    # a run made before a key existed (its saved recipe lacks it) goes on when the key is at its default
    saved = yaml.safe_load((run / "recipe.yaml").read_text())
    del saved["data"]["temperature"]
    (run / "recipe.yaml").write_text(yaml.safe_dump(saved))
    prepare_run(recipe_for(target, prompts), run)
    saved = yaml.safe_load((run / "recipe.yaml").read_text())  # (prepare_run wrote it back in full)
    del saved["data"]["temperature"]  # ... and is refused when the key is not at its default
    (run / "recipe.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(RecipeError, match=r"different recipe \(data.temperature"):
        prepare_run(recipe_for(target, prompts, data={"temperature": 0.5}), run)


def test_eval_compares_imported_published_draft(setup, full_run, capsys):
    """Our draft exported to the EAGLE-3 release layout and imported back sits beside ours in one
    `eyas eval` command, in the same report format, with the same numbers."""
    from eyas.cli import main
    from eyas.serve.interchange.export import export
    from eyas.serve.interchange.importer import import_draft

    root, target, prompts = setup
    ours = full_run / "train" / "checkpoint-final"
    # the tiny target's ids [1, 2, 3] start at 1, which SGLang cannot be told (engines.py): vLLM and TRT-LLM
    export(ours, "eagle3", root / "published", dtype="float32", engines=("vllm", "trtllm"))
    import_draft(root / "published", root / "imported", target=str(target))  # embedding from the target
    rc = main(
        [
            "eval",
            str(full_run),
            "--draft",
            f"eyas={ours}",
            "--draft",
            f"published={root / 'imported'}",
            "--k",
            "1",
            "--k",
            "3",
            "--no-progress",
        ]
    )
    assert rc == 0
    report = json.loads((full_run / "report.json").read_text())
    got = {(r["draft"], r["k"]): r for r in report["results"]}
    assert set(got) == {("eyas", 1), ("eyas", 3), ("published", 1), ("published", 3)}
    for k in (1, 3):
        assert got[("eyas", k)]["acceptance_length"] == got[("published", k)]["acceptance_length"]
        assert got[("eyas", k)]["per_position_acceptance"] == got[("published", k)]["per_position_acceptance"]
        assert len(got[("eyas", k)]["per_position_acceptance"]) == k
    assert report["lossless"] is True
    assert "published" in capsys.readouterr().out


def test_eval_runs_an_imported_v3_shaped_draft_beside_ours(setup, full_run, tmp_path, capsys):
    """A hand-built draft in nvidia/gpt-oss-120b-Eagle3-v3's shape (ModelOpt names, eagle_config with
    boundary ids ending at the target's last layer output and norm_before_fc, `input_norm.weight`, d2t
    only), imported with `eyas import` and evaluated next to the run's own draft in one report."""
    from safetensors.torch import save_file

    from eyas.cli import main
    from eyas.train.checkpoint import load_draft
    from eyas.train.model import Eagle3Draft

    root, target, prompts = setup
    ours = full_run / "train" / "checkpoint-final"
    mine = load_draft(ours)
    n = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    cfg = mine.config
    v3 = Eagle3Draft(
        type(cfg)(**{**cfg.to_dict(), "aux_layer_ids": [n - 2, n - 1, n], "norm_before_fc": True})
    )
    tensors = {
        ("layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k): t.contiguous()
        for k, t in v3.state_dict().items()
        if k not in ("embed_tokens.weight", "t2d")
    }
    tensors["d2t"] = mine.d2t.clone()
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_parameters": cfg.rope_parameters,
        "draft_vocab_size": cfg.draft_vocab_size,
        "tie_word_embeddings": False,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [n - 2, n - 1, n],
            "norm_before_fc": True,
            "use_aux_hidden_state": True,
            "use_input_layernorm_in_first_layer": True,
            "use_last_layernorm": True,
            "parallel_draft_step": 1,
        },
    }
    src = tmp_path / "v3-shaped"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(src / "model.safetensors"))
    assert main(["import", str(src), "--out", str(tmp_path / "v3"), "--target", str(target)]) == 0
    imported = load_draft(tmp_path / "v3")
    assert imported.config.aux_layer_ids == [n - 2, n - 1, n] and imported.config.norm_before_fc
    capsys.readouterr()
    rc = main(
        [
            "eval",
            str(full_run),
            "--draft",
            f"eyas={ours}",
            "--draft",
            f"v3={tmp_path / 'v3'}",
            "--k",
            "3",
            "--no-progress",
        ]
    )
    assert rc == 0
    report = json.loads((full_run / "report.json").read_text())
    got = {r["draft"]: r for r in report["results"] if "draft" in r}
    assert set(got) == {"eyas", "v3"} and report["lossless"] is True
    assert all(len(r["per_position_acceptance"]) == 3 and r["acceptance_length"] >= 1 for r in got.values())
    assert "v3" in capsys.readouterr().out


def test_eval_operating_points(setup, full_run, tmp_path, capsys):
    """`eyas eval RUN --concurrency 1 --concurrency 4 --temperature 0 --temperature 1 --k 1 --k 3 --tree ...`
    on an MT-bench-layout file: every result carries the serving fields, greedy rows are lossless,
    MT-bench categories are reported separately, the plots are PNGs and each (T, C) has a recommendation."""
    from eyas.cli import main

    bench = tmp_path / "mt.jsonl"
    cats = ["writing", "math", "coding"]
    bench.write_text(
        "".join(
            json.dumps(
                {
                    "question_id": i,
                    "category": cats[i % 3],
                    "turns": [f"tell me story about cat {i}", "and a dog"],
                }
            )
            + "\n"
            for i in range(9)
        )
    )
    rc = main(
        [
            "eval",
            str(full_run),
            "--concurrency",
            "1",
            "--concurrency",
            "4",
            "--temperature",
            "0",
            "--temperature",
            "1",
            "--k",
            "1",
            "--k",
            "3",
            "--tree",
            "2,2,4",
            "--prompts",
            f"mt={bench}",
            "--no-progress",
        ]
    )
    assert rc == 0
    report = json.loads((full_run / "report.json").read_text())
    rows = report["results"]
    assert len(rows) == 2 * 2 * 3
    fields = (
        "concurrency",
        "temperature",
        "k",
        "tree",
        "acceptance_length",
        "per_position_acceptance",
        "output_tokens_per_s",
        "baseline_output_tokens_per_s",
        "speedup",
        "ttft_ms_p50",
        "itl_ms_p50",
        "itl_ms_p95",
        "lossless",
    )
    for r in rows:
        assert all(f in r for f in fields), [f for f in fields if f not in r]
        assert r["lossless"] is (True if r["temperature"] == 0 else None)
        assert r["output_tokens_per_s"] > 0 and r["speedup"] > 0 and r["ttft_ms_p50"] > 0
        assert (
            set(r["by_category"]) == set(cats)
            and sum(c["num_prompts"] for c in r["by_category"].values()) == 9
        )
        depth = r["k"] if r["tree"] is None else r["tree"][0]
        assert len(r["per_position_acceptance"]) == depth
        if (
            r["tree"] is None
        ):  # training's estimates beside each chain: replayed only greedy (the loop's rounds)
            assert "training_simulated_tau" in r and ("training_replayed_tau" in r) == (r["temperature"] == 0)
    assert {(r["k"], r["tree"] and tuple(r["tree"])) for r in rows} == {
        (1, None),
        (3, None),
        (None, (2, 2, 4)),
    }
    # the same prompts at the same temperature: acceptance does not depend on concurrency (greedy)
    g = {
        (r["k"], r["concurrency"]): r["acceptance_length"]
        for r in rows
        if r["temperature"] == 0 and r["tree"] is None
    }
    assert g[(3, 1)] == g[(3, 4)] and g[(1, 1)] == g[(1, 4)]
    rec = {(x["temperature"], x["concurrency"]) for x in report["recommendation"]}
    assert rec == {(0.0, 1), (0.0, 4), (1.0, 1), (1.0, 4)}
    for p in report["plots"]:
        assert (full_run / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (full_run / "report.md").read_text()
    assert "## Recommendation" in md and "report-throughput.png" in md and "τ by category" in md
    out = capsys.readouterr().out
    assert "recommend" in out and "tree 2,2,4" in out
    # its cost recorded beside the run's eval stage's, under the options it ran with
    key = (
        "eval --k 1 --k 3 --tree 2,2,4 --concurrency 1 --concurrency 4 --temperature 0.0 --temperature 1.0 "
        f"--prompts mt={bench}"
    )
    cost = json.loads((full_run / layout.STAGE_COSTS).read_text())[key]
    assert cost["wall_s"] > 0 and 50e6 < cost["anon_bytes"] <= cost["peak_bytes"]
    assert f"[eyas] {key}: " in out


def test_eval_prompts_carry_the_reasoning_effort_mix(setup, full_run, tmp_path, monkeypatch):
    """gpt-oss is measured as served: each eval prompt is rendered with an effort drawn from
    data.reasoning_effort (seeded by data.seed, the benchmark and the prompt), recorded in the report."""
    import shutil
    from collections import Counter

    import eyas.data.chat as chat
    from eyas.eval.evaluate import run_eval

    _, target, prompts = setup
    run = shutil.copytree(full_run, tmp_path / "run")
    weights = {"low": 1.0, "high": 1.0}
    seen, real = [], chat.render_prompt
    monkeypatch.setattr(
        chat,
        "render_prompt",
        lambda tok, m, **kw: seen.append(kw.get("reasoning_effort")) or real(tok, m, **kw),
    )
    report = run_eval(
        recipe_for(target, prompts, data={"reasoning_effort": weights}),
        run,
        ks=[1],
        concurrency=[1],
        temperatures=[0.0],
        progress=False,
        force=True,
    )
    bench = report["eval_settings"]["benchmark"]
    expected = [chat.reasoning_effort(weights, 0, f"eval:{bench}:{i}") for i in range(report["num_prompts"])]
    assert seen == expected and set(expected) == {"low", "high"}
    assert report["eval_settings"]["reasoning_effort_mix"] == dict(sorted(Counter(expected).items()))


def test_check_lossless_false_skips_the_references_and_says_so(setup, full_run, tmp_path):
    """eval.check_lossless: false computes no greedy references and no verdict: no row says lossless or not,
    and report.md says the check did not run (the default checks: test_full_run_report)."""
    import shutil

    from eyas.eval.evaluate import run_eval

    _, target, prompts = setup
    run = shutil.copytree(full_run, tmp_path / "run")
    recipe = recipe_for(target, prompts, eval={"check_lossless": False})
    report = run_eval(recipe, run, ks=[2], concurrency=[1], temperatures=[0.0], progress=False, force=True)
    assert report["lossless"] is None and report["eval_settings"]["check_lossless"] is False
    assert all(r["lossless"] is None and "partings" not in r for r in report["results"])
    assert report["target_entropy"] is None  # read off the references, which were not computed
    assert "- lossless: not checked (eval.check_lossless: false)" in (run / "report.md").read_text()


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_training_resumes_to_identical_weights(setup, monkeypatch, optimizer):
    """A crash after the step-2 state save, then a re-run, gives the same draft as no crash (Muon + AdamW:
    both members' states saved and restored)."""
    import shutil

    import eyas.train.ttt as ttt_mod
    from eyas.train.trainer import run_train

    root, target, prompts = setup
    recipe = recipe_for(target, prompts, train={"max_steps": 4, "save_every": 2, "optimizer": optimizer})
    base = root / f"run-train-base-{optimizer}"
    run_all(recipe, base, stages=("prompts", "regenerate", "capture", "vocab"), progress=False)
    crashed = root / f"run-train-crash-{optimizer}"
    shutil.copytree(base, crashed)

    run_train(recipe, base, progress=False)

    real_forward = ttt_mod.TTTModule.forward
    calls = {"n": 0}

    def crash_at_step_3(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated crash")
        return real_forward(self, *a, **k)

    monkeypatch.setattr(ttt_mod.TTTModule, "forward", crash_at_step_3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_train(recipe, crashed, progress=False)
    saved = json.loads((crashed / "train" / "state" / "step.json").read_text())
    assert saved["step"] == 2 and saved["tokens"] > 0 and saved["elapsed_s"] > saved["loop_s"] > 0
    assert not layout.is_done(crashed, "train")
    resumed = {"n": 0}

    def counting(self, *a, **k):
        resumed["n"] += self.training  # training forwards (the end's validation runs in eval mode)
        return real_forward(self, *a, **k)

    monkeypatch.setattr(ttt_mod.TTTModule, "forward", counting)
    run_train(recipe, crashed, progress=False)
    assert resumed["n"] == 2  # steps 3 and 4 only: the first two came from the saved state
    # what each run's DONE.json says of its time and tokens: a resumed run's loop_s is its own part, over
    # its own tokens; run_wall_s adds the earlier process's seconds up to its save
    whole, part = layout.read_done(base, "train"), layout.read_done(crashed, "train")
    assert whole["tokens_this_run"] == whole["tokens_seen"] == part["tokens_seen"]
    assert part["tokens_this_run"] == part["tokens_seen"] - saved["tokens"]
    assert whole["run_wall_s"] == pytest.approx(whole["wall_s"], abs=0.05)
    assert part["run_wall_s"] == pytest.approx(saved["elapsed_s"] + part["wall_s"], abs=0.05)
    assert part["run_loop_s"] == pytest.approx(saved["loop_s"] + part["loop_s"], abs=0.05)
    assert whole["run_loop_s"] == pytest.approx(whole["loop_s"], abs=0.05)
    from eyas.plan.command import plan  # every token over every part's loop, not over the last part's

    # the plan prices training in FLOPs of the rows each run trained (the same rows): the rate it carries from
    # a run is that run's tokens over its whole loop, so the two runs' plans differ as their loops do
    rate = plan(recipe, "cpu", run_dir=crashed).train_tok_s / (part["tokens_seen"] / part["run_loop_s"])
    assert rate == pytest.approx(
        plan(recipe, "cpu", run_dir=base).train_tok_s / (whole["tokens_seen"] / whole["loop_s"])
    )

    a = load_file(str(base / "train" / "checkpoint-final" / "model.safetensors"))
    b = load_file(str(crashed / "train" / "checkpoint-final" / "model.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_keep_best_keeps_the_validation_with_the_highest_replayed_tau(setup):
    """train.keep_best: checkpoint-best holds the draft of the validation (every 2 steps and the last) whose
    replayed tau at eval.k was highest (the first on a tie), beside checkpoint-final; it is the run's draft;
    without train.val_every the recipe is refused by name."""
    from eyas.train.checkpoint import load_draft

    root, target, prompts = setup
    over = {"max_steps": 6, "val_every": 2, "keep_best": True, "val_fraction": 0.25, "lr": 3e-3}
    recipe = recipe_for(target, prompts, train=over)
    run = root / "run-keep-best"
    run_all(recipe, run, stages=("prompts", "regenerate", "capture", "vocab", "train"), progress=False)
    vals = [e for e in io.read_jsonl(run / "train" / "log.jsonl") if "val" in e]
    assert [e["step"] for e in vals] == [2, 4, 6]
    top = max(vals, key=lambda e: e["val"]["replayed_tau"][2])  # max keeps the first of equals
    best = layout.read_done(run, "train")["best"]
    assert (best["step"], best["metric"], best["k"]) == (top["step"], "replayed_tau", 3)
    assert best["score"] == top["val"]["replayed_tau"][2] and best["validation"] == top["val"]
    assert layout.run_checkpoint(run) == run / layout.BEST_CHECKPOINT
    kept = load_draft(run / layout.BEST_CHECKPOINT).state_dict()
    final = load_draft(run / layout.FINAL_CHECKPOINT).state_dict()
    assert (top["step"] == 6) == all(torch.equal(kept[n], final[n]) for n in final)
    with pytest.raises(
        RecipeError, match="train.keep_best: chooses among validations: needs train.val_every"
    ):
        recipe_for(target, prompts, train={"keep_best": True})


@pytest.mark.parametrize("lm_head", ["target", "target_frozen"])
def test_lm_head_from_the_target(setup, lm_head):
    """draft.lm_head: the draft starts from the target's lm_head rows of its vocab (t2d order); frozen,
    they are the checkpoint's exactly after training, trained, they moved."""
    from eyas.data.target import load_head_weights
    from eyas.train.trainer import run_train

    root, target, prompts = setup
    recipe = recipe_for(target, prompts, train={"max_steps": 3}, draft={"lm_head": lm_head})
    run = root / f"run-lm-head-{lm_head}"
    run_all(recipe, run, stages=("prompts", "regenerate", "capture", "vocab"), progress=False)
    run_train(recipe, run, progress=False)
    t2d = load_file(str(run / "vocab" / "vocab.safetensors"))["t2d"]
    rows = load_head_weights(str(target))["lm_head"][t2d].float()  # (V_d, H)
    weights = load_file(str(run / "train" / "checkpoint-final" / "model.safetensors"))
    saved = weights["lm_head.weight"].float()
    assert saved.shape == rows.shape
    if lm_head == "target_frozen":
        assert torch.equal(saved, rows)
        frozen = ("embed_tokens.weight", "lm_head.weight", "d2t", "t2d")
        trained = sum(t.numel() for n, t in weights.items() if n not in frozen)
        assert layout.read_done(run, "train")["trainable_parameters"] == trained
    else:
        assert 0 < (saved - rows).abs().max() < 0.5 * rows.abs().max()


def test_wandb_offline_tracking(setup, tmp_path, monkeypatch):
    """train.report_to: wandb through accelerate's trackers, offline (no network): the run's metrics
    per TTT step land in a wandb run under RUN/train/wandb."""
    pytest.importorskip("wandb")
    from eyas.train.trainer import run_train

    root, target, prompts = setup
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    recipe = recipe_for(target, prompts, train={"max_steps": 2, "report_to": "wandb"})
    run = tmp_path / "run"
    run_all(recipe, run, stages=("prompts", "regenerate", "capture", "vocab"), progress=False)
    run_train(recipe, run, progress=False)
    import wandb

    wandb.teardown()  # the wandb-core service writes the record log asynchronously: shut it down (flush)
    records = list((run / "train" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(records) == 1  # one offline run; its record log holds the history and config protobufs
    deadline = time.time() + 30
    while b"val/simulated_tau_k3" not in (data := records[0].read_bytes()) and time.time() < deadline:
        time.sleep(0.2)  # teardown flushes; allow a slow machine a moment more
    for key in (
        b"train/loss",
        b"train/cond_acc_2",
        b"train/simulated_tau",
        b"val/simulated_tau_k3",
        b"lr",
        b"train.report_to",
        b"capture.aux_layer_ids",
    ):
        assert key in data, key


def test_plan_from_a_finished_run_uses_its_measured_rates(setup, full_run):
    """`eyas plan --run DIR`: a bigger run of the same recipe, timed with the rates this run measured."""
    from eyas.data.regenerate import read_sequences
    from eyas.plan.command import plan
    from eyas.plan.cost import target_config
    from eyas.plan.flops import capture_work, forward_cost
    from eyas.plan.train_work import trained_pairs

    root, target, prompts = setup
    r = recipe_for(target, prompts)
    r.data.num_prompts = 10_000
    p = plan(r, "2xH100", run_dir=full_run)
    regen, cap, tr = (layout.read_done(full_run, s) for s in ("regenerate", "capture", "train"))
    assert p.measured == ["capture_flop_s", "regen_tok_s", "train_tok_s"]
    assert p.mean_tokens == pytest.approx(cap["num_tokens"] / cap["num_sequences"])
    assert p.tokens == pytest.approx(10_000 * cap["num_tokens"] / cap["num_sequences"])
    assert p.sequences == round(
        10_000 * regen["num_sequences"] / regen["num_prompts"]
    )  # turns per prompt asked
    assert p.replicas == 2  # the tiny target fits one GPU: a regeneration and a capture shard on each
    # plus what --run's stage took beyond its rate (loading the target), once: replicas start together
    regen_setup = regen["wall_s"] - regen["generated_tokens_this_run"] / regen["generation_tokens_per_s"]
    cap_setup = cap["wall_s"] - cap["num_tokens"] / cap["tokens_per_s"]
    train_setup = tr["wall_s"] - tr["loop_s"]
    assert p.setup_s == {
        "regenerate": pytest.approx(regen_setup),
        "capture": pytest.approx(cap_setup),
        "train": pytest.approx(train_setup),
    }
    assert regen_setup > 0 and cap_setup > 0 and train_setup > 0
    assert p.regen_s == pytest.approx(
        10_000 * regen["mean_generated_tokens"] / (2 * regen["generation_tokens_per_s"]) + regen_setup
    )
    # capture in FLOPs (eyas/plan/flops.py): the run's forwards over its own sequences in its batches of
    # capture.batch_size, padded, at its forward time; the bigger run's at that rate on each replica
    lengths = [len(s["input_ids"]) for s in read_sequences(full_run)]
    ran = capture_work(forward_cost(target_config(r)[0], p.target, r.capture), lengths)
    rate = ran.flops / (cap["num_tokens"] / cap["tokens_per_s"])  # one shard: its FLOPs over its time
    assert p.capture_flop_s == pytest.approx(2 * rate)
    # two replicas, a shard each: the planned run takes as long as its shard of the longest sequences
    assert len(p.capture_work.shard_flops) == 2
    assert p.capture_s == pytest.approx(max(p.capture_work.shard_flops) / rate + cap_setup)
    train_rate = tr["tokens_seen"] / tr["loop_s"] / tr["num_processes"]  # the step loop's rate
    # training in FLOPs (eyas/plan/train_work.py): the run's rows as it trained them, token for token
    assert trained_pairs(r, full_run, tr["steps"], tr["num_processes"])[0] == tr["tokens_seen"]
    assert p.train_tok_s == pytest.approx(2 * train_rate, rel=0.1)  # short sequences: attention is little
    trained = r.train.epochs * p.tokens * (1 - r.train.val_fraction)  # the tuning split held out
    assert p.train_s == pytest.approx(trained / p.train_tok_s + train_setup)


def test_plan_on_a_cpu_takes_every_rate_from_the_run_and_the_run_records_each_stages_cost(setup, full_run):
    """`eyas plan --gpus cpu --run DIR`: this machine, its memory the host's, every rate the run's own (eyas
    assumes no CPU's speed: without --run it names the stages to run first), its capture's memory the
    target's and the shard it writes; `eyas run` wrote each stage's wall time and peak memory to
    RUN/stage_costs.json to set beside it, which the plan's memory matches."""
    import json
    import os

    from eyas.data.regenerate import read_sequences
    from eyas.plan.command import plan
    from eyas.plan.cost import Assumptions
    from eyas.plan.report import render

    _, target, prompts = setup
    r = recipe_for(target, prompts)
    p = plan(r, "cpu", run_dir=full_run)
    regen, cap, tr = (layout.read_done(full_run, s) for s in ("regenerate", "capture", "train"))
    host_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    assert (p.gpus, p.gpu_memory_gb, p.replicas) == ("1xCPU", host_gb, 1)
    assert p.measured == ["capture_flop_s", "regen_tok_s", "train_tok_s"]
    # the run's own size: its lengths spread again, batched as the run batched them, give its rate back
    assert p.regen_tok_s == regen["generation_tokens_per_s"]
    assert p.capture_tok_s == pytest.approx(cap["tokens_per_s"], rel=0.05)
    assert p.train_tok_s == pytest.approx(tr["tokens_seen"] / tr["loop_s"] / tr["num_processes"], rel=0.1)
    text = render(r, p)
    assert text.startswith(f"plan for {r.name} on 1xCPU ({host_gb:,.0f} GB each; the host's memory")
    assert "all-reduce" not in text  # one process: nothing to all-reduce, nothing assumed of it
    assert re.search(r"= [1-9][\d,.]*[KM]? tokens", text)  # a small run's tokens, not "0.000B tokens"
    # a CPU's capture holds the shard it fills beside the target: its rows, packed as they come
    bpt, gpu = p.capture_bytes_per_token, plan(r, "1xH100", run_dir=full_run)
    longest = r.data.max_prompt_tokens + r.data.max_new_tokens  # the buffer's room past shard_tokens - 1
    shard = min(r.capture.shard_tokens - 1 + longest, p.capture_bytes / bpt) * bpt
    m, floor = p.capture_memory, Assumptions().cpu_process_bytes
    assert m.shard == pytest.approx(shard) and gpu.capture_memory.shard == 0
    assert m.longest == max(len(q["input_ids"]) for q in read_sequences(full_run))  # the run's longest
    assert m.weights == p.target.params * 4  # target.dtype auto on a CPU: float32, as data/target.py loads it
    assert p.process_bytes["capture"] == pytest.approx(m.total + floor)  # the interpreter's floor beside it
    assert f"; {shard / 1e6:,.1f} MB of host memory for the shard it fills" in text
    with pytest.raises(
        ValueError,
        match=r"--gpus cpu: eyas assumes no CPU's speed; pass --run DIR, a smaller "
        r"run of this recipe that has finished regenerate, capture, train",
    ):
        plan(r, "cpu")
    costs = json.loads((full_run / layout.STAGE_COSTS).read_text())
    stages = ["prompts", "regenerate", "capture", "vocab", "train", "eval"]
    assert [k for k in costs if k in stages] == stages  # `eyas eval` with options: entries of their own
    # the plan's memory against the run's, where the run ran on this CPU: capture and training within 30% of
    # their resident peaks (0.40 / 0.42 and 0.49 / 0.47 GB on the AVX2 EPYC: on this tiny target mostly the
    # interpreter's floor, which the plan without it, a few MB, misses by far); eval's an upper bound (the
    # recipe's longest requests, which these prompts do not reach)
    if not torch.cuda.is_available():
        for stage in ("capture", "train"):
            assert p.process_bytes[stage] == pytest.approx(costs[stage]["peak_bytes"], rel=0.3), stage
        assert p.process_bytes["eval"] >= costs["eval"]["peak_bytes"]
    for stage, cost in costs.items():
        assert cost["wall_s"] > 0, stage
        # this process's own peak in bytes (Linux reports kB): at least the interpreter's resident set
        assert cost["peak_bytes"] > 50e6, stage
        assert 50e6 < cost["anon_bytes"] <= cost["peak_bytes"], stage  # anonymous: part of the resident set


def test_eval_on_a_split_target_measures_what_one_device_does(setup, full_run, tmp_path):
    """`eyas eval` with target.device_map placing the embedding and half the layers off the main device
    (on disk here; GPUs on a node): the same tau, per-position acceptance and losslessness as on one
    device, at k = 3 and a tree, greedy and at T = 1, one and four requests at a time."""
    import shutil

    from data_fixtures import split_map

    from eyas.eval.evaluate import run_eval

    _, target, prompts = setup
    placed = {
        "device_map": split_map(4, embed="disk", lm_head="cpu"),
        "offload_folder": str(tmp_path / "off"),
    }
    reports = []
    for name, where in (("one", {}), ("split", placed)):
        raw = tiny_recipe(target, prompts)
        raw["target"].update(where)
        run = shutil.copytree(full_run, tmp_path / name)
        reports.append(
            run_eval(
                load_recipe(raw),
                run,
                ks=[3],
                trees=["2,2,4"],
                concurrency=[1, 4],
                temperatures=[0.0, 1.0],
                progress=False,
                force=True,
            )
        )
    one, split = reports
    assert "layer 1 on disk" in split["device"] and one["device"] == "cpu"
    keys = (
        "k",
        "tree",
        "concurrency",
        "temperature",
        "acceptance_length",
        "per_position_acceptance",
        "lossless",
    )
    assert [[r[k] for k in keys] for r in split["results"]] == [[r[k] for k in keys] for r in one["results"]]
    assert split["lossless"] is True and len(split["results"]) == 8


def test_init_from_warm_starts_the_same_draft_and_refuses_another(setup, full_run):
    """draft.init_from: a checkpoint of the run's own shape and kind is the draft training starts from (its
    weights as saved); one whose shape or kind differs is refused, naming each field, the fields only one of
    the two kinds has as None on the other (P-EAGLE's mask token against an EAGLE-3 checkpoint)."""
    from eyas.train.checkpoint import load_draft
    from eyas.train.trainer import build_draft

    root, target, prompts = setup
    ckpt = str(full_run / "train" / "checkpoint-final")
    draft = build_draft(recipe_for(target, prompts, draft={"init_from": ckpt}), full_run, {})
    saved = load_draft(ckpt)
    assert draft.config == saved.config
    assert all(torch.equal(a, b) for a, b in zip(draft.state_dict().values(), saved.state_dict().values()))
    with pytest.raises(ValueError, match=r"its num_layers 1 != this run's 2$"):
        build_draft(recipe_for(target, prompts, draft={"init_from": ckpt, "num_layers": 2}), full_run, {})
    peagle = recipe_for(target, prompts, draft={"init_from": ckpt, "kind": "peagle"})
    with pytest.raises(ValueError) as e:
        build_draft(peagle, full_run, {})
    assert "its kind 'eagle3' != this run's 'peagle'" in str(e.value)
    assert "its mask_token_id None != this run's " in str(e.value)


def test_a_stages_own_command_records_its_cost_as_eyas_run_does(setup, tmp_path, capsys):
    """`eyas prompts` and `eyas regenerate` run alone (as a run resumed stage by stage is) write their wall
    time and peak memory to RUN/stage_costs.json as `eyas run` does; a stage already done is skipped, says
    so, and keeps its entry; a damaged stage_costs.json is warned of, and the stage (capture) still ends
    done."""
    from eyas.cli import main

    _, target, prompts = setup
    recipe_file, run = tmp_path / "tiny.yaml", tmp_path / "run"
    recipe_file.write_text(yaml.safe_dump(tiny_recipe(target, prompts)))
    for stage in ("prompts", "regenerate"):
        assert main([stage, str(recipe_file), "--out", str(run), "--no-progress"]) == 0
    costs = json.loads((run / layout.STAGE_COSTS).read_text())
    assert list(costs) == ["prompts", "regenerate"]
    for stage, cost in costs.items():
        assert cost["wall_s"] > 0, stage
        assert 50e6 < cost["anon_bytes"] <= cost["peak_bytes"], stage
    capsys.readouterr()
    assert main(["regenerate", str(recipe_file), "--out", str(run), "--no-progress"]) == 0
    assert "[eyas] regenerate: done already, skipped" in capsys.readouterr().out
    assert json.loads((run / layout.STAGE_COSTS).read_text()) == costs
    (run / layout.STAGE_COSTS).write_text("{cut off")  # a damaged record warns; the stage still succeeds
    assert main(["capture", str(recipe_file), "--out", str(run), "--no-progress"]) == 0
    assert layout.is_done(run, "capture")
    assert "[eyas] warning: capture's cost not recorded in " in capsys.readouterr().out
