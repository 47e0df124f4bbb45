"""The README.md (Hugging Face model card) of a published eyas draft.

Everything in it comes from the run: the measured acceptance from RUN/report.json, the recipe
from RUN/recipe.yaml, per-stage stats from RUN/<stage>/DONE.json, the export's checks and notes.
Serving commands are written for the draft's own k and aux layers:
  vLLM     `vllm serve TARGET --speculative-config '{"method": "eagle3", "model": REPO,
           "num_speculative_tokens": K}'` (aux ids from the draft's top-level config)
  SGLang   `--speculative-algorithm EAGLE3 --speculative-draft-model-path REPO
           --speculative-num-steps K --speculative-eagle-topk 1 --speculative-num-draft-tokens K+1`
           (a chain: topk 1, K steps, K+1 tokens verified; aux ids from eagle_config)
  TRT-LLM  YAML `speculative_config: {decoding_type: Eagle3, max_draft_len: K, speculative_model:
           REPO, eagle3_layers_to_capture: [k-1 ...]}` for `trtllm-serve --backend pytorch`
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from eyas.eval.report import recommendation_table, shape_label
from eyas.infra.layout import FinishedRun
from eyas.serve.interchange import engines as engine_rules
from eyas.serve.interchange.export import ExportResult
from eyas.train.kinds import DEFAULT_KIND, kind_named
from eyas.train.kinds.config_json import output_numbering, sglang_layer_ids

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
ENGINE_TAGS = {"vllm": "vllm", "sglang": "sglang", "trtllm": "tensorrt-llm"}


def is_hub_id(name: str | None) -> bool:
    return bool(name) and HUB_ID.match(name) is not None and not Path(name).exists()


def _num(x, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "—"


def _baseline_tps(report: dict):
    """Plain greedy tokens/s, measured once per report (eval/evaluate.py: top-level dict)."""
    tps = report.get("tokens_per_second")
    return tps.get("baseline") if isinstance(tps, dict) else None


def acceptance_rows(report: dict) -> list[dict]:
    """One row per (draft, benchmark, k) result; a report without `results` gives its top-level one."""
    if report.get("results"):
        return list(report["results"])
    settings = report.get("eval_settings") or {}
    return [{**report, "draft": "eyas", "benchmark": settings.get("benchmark", "held-out")}]


def acceptance_table(report: dict) -> str:
    """One row per eval result: temperature T, concurrency C and draft shape (k or tree) included.
    Older reports (greedy, one request at a time) read as T = 0, C = 1."""
    baseline = _baseline_tps(report)
    greedy = (report.get("eval_settings") or {}).get("greedy", True)
    lines = [
        "| draft | benchmark | T | C | shape | τ (mean accepted length) | per-position acceptance | prompts "
        "| lossless | tok/s speculative | tok/s no speculation | speedup |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in acceptance_rows(report):
        per_pos = " / ".join(_num(p) for p in row.get("per_position_acceptance") or []) or "—"
        tps = row.get("tokens_per_second")
        spec = row.get("output_tokens_per_s", tps.get("speculative") if isinstance(tps, dict) else tps)
        base = (
            row.get("baseline_output_tokens_per_s")
            or (tps.get("baseline") if isinstance(tps, dict) else None)
            or baseline
        )
        speedup = (
            f"{spec / base:.2f}×"
            if isinstance(spec, (int, float)) and isinstance(base, (int, float)) and base > 0
            else "—"
        )
        lossless = {True: "yes", False: "**no**"}.get(row.get("lossless"), "—")
        temp = row.get("temperature", 0.0 if greedy else None)
        lines.append(
            f"| {row.get('draft', '—')} | {row.get('benchmark', '—')} | "
            f"{'—' if temp is None else f'{temp:g}'} | {row.get('concurrency', 1)} | {shape_label(row)} "
            f"| {_num(row.get('acceptance_length'))} | {per_pos} | {row.get('num_prompts', '—')} "
            f"| {lossless} | {_num(spec, 1)} | {_num(base, 1)} | {speedup} |"
        )
    return "\n".join(lines)


def advice_section(report: dict) -> list[str]:
    """The k / tree recommendation per concurrency level (eval/advice.py), when the eval made one."""
    rows = report.get("recommendation")
    if not rows:
        return []
    return [
        "## Which k at which concurrency",
        "",
        "Predicted from the measured acceptance and the measured cost of target and draft forwards by "
        "batch size and tokens verified (eyas eval's cost model), next to the measured speedup where that "
        "shape was run. `no speculation` means no shape was predicted to beat plain decoding.",
        "",
        recommendation_table(rows),
        "",
    ]


def _flat(stats: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in stats.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out += _flat(value, name + ".")
        elif isinstance(value, list):
            short = len(value) <= 8 and all(isinstance(v, (int, float, str, bool)) for v in value)
            out.append(f"{name}={value}" if short else f"{name}=[{len(value)} items]")
        elif isinstance(value, float):
            out.append(f"{name}={value:.4g}")
        else:
            out.append(f"{name}={value}")
    return out


def _recipe_facts(recipe: dict) -> list[str]:
    """Recipe settings that shape the draft, where the recipe has them."""
    wanted = [
        ("target", "model"),
        ("data", "prompts"),
        ("data", "num_prompts"),
        ("data", "max_new_tokens"),
        ("data", "temperature"),
        ("data", "reasoning_effort"),
        ("capture", "aux_layer_ids"),
        ("vocab", "draft_vocab_size"),
        ("train", "ttt_steps"),
        ("train", "epochs"),
        ("train", "max_steps"),
        ("train", "lr"),
        ("train", "batch_size"),
        ("train", "grad_accum"),
        ("train", "max_length"),
    ]
    facts = []
    for section, key in wanted:
        value = (recipe.get(section) or {}).get(key)
        if key == "prompts" and isinstance(value, list):  # several sources mixed by weight
            value = ", ".join(
                f"{s['source']}"
                + (f" ({s['split']})" if s.get("split", "train") != "train" else "")
                + f" × {s.get('weight', 1.0):g}"
                for s in value
            )
        if value is not None:
            facts.append(f"- `{section}.{key}`: {value}")
    return facts


def front_matter(target: str | None, engines: tuple[str, ...], license: str, kind: str = DEFAULT_KIND) -> str:
    meta = {
        "license": license,
        "library_name": "eyas",
        "tags": ["speculative-decoding", kind, "eyas", *(ENGINE_TAGS[e] for e in engines)],
    }
    if is_hub_id(target):
        meta["base_model"] = target
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


def vllm_spec(kind: str, repo_id: str, k: int) -> dict:
    """vLLM 0.32's --speculative-config for a published draft of `kind` (train/kinds/ DraftKind.vllm_config;
    train/kinds/ speculative_config builds the same for a local export)"""
    return kind_named(kind).vllm_config(repo_id, k)


def serving_section(repo_id: str, target: str, k: int, result: ExportResult) -> str:
    cfg = result.config
    parts = ["## Serving", ""]
    if "vllm" in result.engines:
        spec = json.dumps(vllm_spec(cfg.kind, repo_id, k))
        parts += [
            "### vLLM",
            "",
            "```bash",
            f"vllm serve {target} \\",
            f"  --speculative-config '{spec}'",
            "```",
            "",
            kind_named(cfg.kind).card_aux,
            "",
        ]
    if "sglang" in result.engines:
        parts += [
            "### SGLang",
            "",
            "```bash",
            f"python -m sglang.launch_server --model {target} \\",
            "  --speculative-algorithm EAGLE3 \\",
            f"  --speculative-draft-model-path {repo_id} \\",
            f"  --speculative-num-steps {k} --speculative-eagle-topk 1 "
            f"--speculative-num-draft-tokens {k + 1}",
            "```",
            "",
            "A chain of k drafted tokens (top-k 1), k + 1 tokens verified per step. SGLang reads "
            "the aux layers from `eagle_config.eagle_aux_hidden_state_layer_ids`.",
            "",
        ]
    if "trtllm" in result.engines:
        capture = output_numbering(cfg.aux_layer_ids)
        parts += [
            "### TensorRT-LLM (PyTorch backend)",
            "",
            "`eagle3.yaml`:",
            "",
            "```yaml",
            "speculative_config:",
            "  decoding_type: Eagle3",
            f"  max_draft_len: {k}",
            f"  speculative_model: {repo_id}  # older releases: speculative_model_dir: <local copy>",
            f"  eagle3_layers_to_capture: {capture}",
            "kv_cache_config:",
            "  enable_block_reuse: false",
            "```",
            "",
            "```bash",
            f"trtllm-serve {target} --backend pytorch --extra_llm_api_options eagle3.yaml",
            "```",
            "",
            f"`eagle3_layers_to_capture` numbers the output of a decoder layer: {capture} are the eyas / "
            f"vLLM ids {list(cfg.aux_layer_ids)} minus one (TensorRT-LLM's default would be "
            "{1, N//2-1, N-4}).",
            "",
        ]
    return "\n".join(parts)


def convention_section(result: ExportResult) -> str:
    ids = list(result.config.aux_layer_ids)
    return "\n".join(
        [
            "## Aux layer ids",
            "",
            f"The draft reads the target's hidden states at layers {ids} (eyas / vLLM numbering: id k is the "
            "*input* of decoder layer k, 0-based — Hugging Face `hidden_states[k]`; id N, the layer count, "
            "is the output of the last layer before the final norm), concatenated in that order into `fc`.",
            "",
            *written_ids(result.config.kind, ids),
            "",
        ]
    )


def written_ids(kind: str, ids: list[int]) -> list[str]:
    """Where the config.json of `kind`'s own layout writes the aux ids, and who reads them how (the kind's
    card_ids, given SGLang's numbering of them)."""
    return kind_named(kind).card_ids(ids, sglang_layer_ids(ids))


def render_model_card(
    run: FinishedRun, repo_id: str, result: ExportResult, k: int, license: str = "apache-2.0"
) -> str:
    """README.md text for `repo_id`, published from `run` via the export `result` (its kind's layout)."""
    cfg = result.config
    own_map = kind_named(cfg.kind).always_vocab_map  # DFlash's z-lab layout writes no d2t / t2d at full vocab
    report = run.report
    target = result.target or report.get("target") or "TARGET"
    settings = report.get("eval_settings") or {}
    target_ref = f"[{target}](https://huggingface.co/{target})" if is_hub_id(target) else f"`{target}`"
    lines = [
        front_matter(target, result.engines, license, cfg.kind),
        f"# {repo_id.split('/')[-1]}",
        "",
        f"{kind_named(cfg.kind).card_title} for {target_ref}, trained with eyas. It proposes "
        "tokens that the target verifies, so outputs are those of the target alone.",
        "",
        "| | |",
        "|---|---|",
        f"| target | {target} |",
        f"| draft layers | {cfg.num_layers} {kind_named(cfg.kind).layer_family} "
        f"layer{'s' if cfg.num_layers > 1 else ''}, hidden "
        f"{cfg.hidden_size}, {cfg.num_attention_heads} heads × {cfg.head_dim} ({cfg.num_key_value_heads} KV "
        f"heads), MLP {cfg.intermediate_size} |",
        kind_named(cfg.kind).card_options(cfg),
        f"| vocab | draft {cfg.draft_vocab_size} of the target's {cfg.vocab_size}"
        f"{' (`d2t`/`t2d`)' if cfg.draft_vocab_size != cfg.vocab_size or own_map else ''} |",
        f"| aux layers | {list(cfg.aux_layer_ids)} (see below) |",
        f"| RoPE | `{json.dumps(cfg.rope_parameters)}`, max positions {cfg.max_position_embeddings} |",
        f"| weights | {str(result.dtype).replace('torch.', '')}, {kind_named(cfg.kind).card_layout} |",
        f"| checked for | {', '.join(engine_rules.ENGINE_LABELS[e] for e in result.engines)}; re-read by "
        f"eyas, logits identical to the trained checkpoint's at {str(result.dtype).replace('torch.', '')} |",
        "",
        "## Measured acceptance",
        "",
        acceptance_table(report),
        "",
        f"Eval: greedy={settings.get('greedy', '—')}, max_new_tokens={settings.get('max_new_tokens', '—')}, "
        f"benchmark={settings.get('benchmark', '—')}, target entropy {_num(report.get('target_entropy'))}. "
        "τ is the mean number of tokens emitted per target forward pass (accepted draft tokens + 1); "
        "per-position acceptance is the acceptance rate at draft position 1, 2, … ; T is the sampling "
        "temperature, C the number of requests in flight.",
        "",
        *advice_section(report),
        serving_section(repo_id, target, k, result),
        convention_section(result),
        "## Training",
        "",
    ]
    lines += _recipe_facts(run.recipe) or ["(see recipe below)"]
    if run.stages:
        lines += ["", "Stage statistics (`RUN/<stage>/DONE.json`):", ""]
        lines += [f"- **{stage}**: {', '.join(_flat(stats)) or '—'}" for stage, stats in run.stages.items()]
    if report.get("stage_times"):
        times = ", ".join(f"{s} {_num(t, 0)} s" for s, t in report["stage_times"].items())
        lines += ["", f"Stage wall times: {times}."]
    lines += [
        "",
        "<details><summary>recipe.yaml</summary>",
        "",
        "```yaml",
        run.recipe_text.rstrip(),
        "```",
        "",
        "</details>",
        "",
    ]
    if result.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in result.notes] + [""]
    return "\n".join(lines)
