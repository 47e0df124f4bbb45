"""The interface every draft kind answers (train/kinds/<name>/): what the trainer, the loop, export, import,
the plan and the recipe's schema ask a kind, so that none of them names one.

Torch-free, as each kind's `__init__.py` is, so that the schema and `eyas plan` read a kind before anything
loads; the kind's torch half (its model and training unroll) is its `core.py`, imported on first use of
`model` / `forward` from the dotted name in `core`, as vLLM's model registry imports a model class by name.

    face                      asked by                          EAGLE-3 (the defaults here)
    model, forward, options   the trainer, replay, benchmarks   Eagle3Draft, ttt_forward, {}
    trained_k, untrained_k    schema, loop, eval, serve, export 1 .. ttt_steps; any k served
    check_recipe              recipes/schema.py                 no options of another kind
    proposal, commit          the loop (serve/decoding/engine)  a tree of draft forwards; one step a token
    unrolled, on_grid, ...    eyas plan, k advice               ttt_steps; nothing on the grid
    engines, formats, ...     export, the model card, vLLM      vLLM, SGLang, TensorRT-LLM; eagle3 layout
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

from .config_json import eagle3_config, speculators_config


class DraftKind:
    """A draft kind: class attributes say what it is, methods what it does with a recipe's train section `tr`
    (recipes/schema.py TrainSection) or a checkpoint's DraftConfig `cfg`. One instance a kind (KINDS)."""

    name: ClassVar[str]
    summary: ClassVar[str]
    # the dotted module of its torch half: MODEL (a class built from a DraftConfig), UNROLL, ROWS
    core: ClassVar[str]
    # "module:Class" of its recipe `draft` section (recipes/draft.py), a module in the recipes' layer
    draft_section: ClassVar[str]
    # its checkpoint config: DraftConfig's fields and its own (train/kinds/<name>/config.py), which
    # DraftConfig(kind=name, ...) builds
    config_class: ClassVar[type]
    chains_only: ClassVar[bool] = False  # proposes chains only (no trees)
    # train.sequence_parallel splits the attention's heads over a row's ranks (Ulysses: P divides them);
    # otherwise the row's context is gathered (train/sequence_parallel.py)
    sp_splits_heads: ClassVar[bool] = True
    anchor_row: ClassVar[bool] = (
        False  # a draft forward's first lm_head row is its anchor's, proposing nothing
    )
    feeds_output_back: ClassVar[bool] = True  # a draft's output is the next draft step's input (norm_output)
    # recipe options ("section.key") only this kind reads: set for another kind, they are refused
    own_options: ClassVar[tuple[str, ...]] = ()
    mask_slots: ClassVar[bool] = False  # its parallel slots take a mask token (DraftConfig.mask_token_id)
    # the loop's round ("module:function" of its loop.py, a module of the serve layer, loaded by `round`):
    # the proposal of k drafts, and what a committed token writes into the draft's cache
    proposal: ClassVar[str] = "eyas.train.kinds.eagle3.loop:propose_tree"
    commit: ClassVar[str] = "eyas.train.kinds.eagle3.loop:draft_step"
    # published: the layouts its weights go out in (serve/interchange/formats.py FORMATS) and the engines
    # that serve it (serve/interchange/engines.py ENGINES)
    formats: ClassVar[tuple[str, ...]] = ("eagle3", "speculators")
    engines: ClassVar[tuple[str, ...]] = ("vllm", "sglang", "trtllm")
    speculators_type: ClassVar[str] = "eagle3"  # speculators' `speculators_model_type` (vLLM reads it)
    vllm_model: ClassVar[str] = "llama_eagle3.py"  # the vLLM 0.32 model file that serves it
    layer_family: ClassVar[str] = "Llama"  # the decoder layers' family, as the model card names it
    card_title: ClassVar[str]
    card_layout: ClassVar[str]
    card_aux: ClassVar[str]

    # -- its torch half --------------------------------------------------------------------------------
    @property
    def model(self) -> type:
        return importlib.import_module(self.core).MODEL

    @property
    def round(self) -> tuple:
        """(proposal, commit): its loop.py functions the serving loop's Engine calls with itself, imported
        on first use, as `core` is."""
        return tuple(_resolve(spec) for spec in (self.proposal, self.commit))

    @property
    def forward(self):
        """The training unroll: (draft, aux, input_ids, loss_mask, doc_ids, target, steps, ...)."""
        return importlib.import_module(self.core).UNROLL

    @property
    def rows(self):
        """The teacher's rows its training reads: (input_ids, loss_mask, doc_ids, steps, **options) -> (B, T)
        bool (train/ttt.py read_rows; DFlash's: its drawn blocks'), computed alone by TTTModule."""
        return importlib.import_module(self.core).ROWS

    def options(self, tr) -> dict[str, Any]:
        """The unroll's own keyword options in training ({}: none)."""
        return {}

    # -- the rounds it trains and serves -------------------------------------------------------------
    def trained_k(self, tr) -> list[int]:
        """The rounds of k drafts that training with `tr` makes (DraftConfig.trained_k records them)."""
        return list(range(1, tr.ttt_steps + 1))

    def untrained_k(self, trained: list[int] | None, k: int) -> str | None:
        """Why a round of `k` drafts is a shape a draft that trained `trained` did not train (one line, for a
        refusal), or None where it did, or where `trained` is None (not recorded: an imported draft)."""
        return None

    def k_problem(self, cfg, k: int) -> str | None:
        """Why a draft of DraftConfig `cfg` cannot draft `k` tokens a round at all (None: it can)."""
        return None

    def check_recipe(self, recipe, check) -> None:
        """The kind's own refusals and defaults across a recipe's sections; `check(ok, key, why)` refuses."""

    # -- eyas plan and k advice ---------------------------------------------------------------------------
    def draft_forwards(self, shape) -> int:
        """Draft forwards of one round of TreeShape `shape` (the step over the accepted path too)."""
        return shape.steps

    def unrolled(self, tr) -> float:
        """One row's steps' worth of per-token activations and compute in training."""
        return float(tr.ttt_steps)

    def on_grid(self, tr) -> float:
        """The steps' worth of the attention's and the loss's tensors on the whole (B, T) grid beyond
        `unrolled`."""
        return 0.0

    def loss_rows(self, tr) -> tuple[bool, float]:
        """Which positions a training step's loss runs over (train/ttt.py step_loss) -> (whether some step's
        runs over every unrolled position in place, the largest share of them a step's gathers first: a copy
        of those rows' teacher and states; 0: none)."""
        return True, 0.0

    def grid_bytes(self, tr, c) -> tuple[float, float]:
        """The per-token bytes on the (B, T) grid beyond the unrolled steps, for a DraftConfig `c` -> (a token
        of the rank's shard, a token of the whole row). P-EAGLE's form: each depth's attention on the grid
        (q, k, v, its output and log-sum-exp, bf16, every layer) and its loss's (B, T, H) states (two
        copies)."""
        qkvo = 2 * c.num_attention_heads * c.head_dim + 2 * c.num_key_value_heads * c.head_dim
        per_depth = c.num_layers * (2 * qkvo + 4 * c.num_attention_heads) + 2 * 2 * c.hidden_size
        return per_depth * self.on_grid(tr), 0.0

    # `eyas plan --run` carries its training rate in FLOPs (plan/train_work.py): a token costs the TTT steps
    # x the draft's weights, a row its causal pairs; P-EAGLE's depths and DFlash's blocks cost otherwise
    flops_priced_training: ClassVar[bool] = True

    def unrolled_whole_row(self) -> bool:
        """Its unrolled steps run over the whole row on every rank under train.sequence_parallel."""
        return False

    def plan_note(self, tr, unrolled: float) -> str:
        """The plan's line on a training row's unrolled steps."""
        return f"x TTT {tr.ttt_steps}"

    # -- published -------------------------------------------------------------------------------------
    def vllm_config(self, model: str, k: int) -> dict[str, Any]:
        """vLLM 0.32's --speculative-config for this draft at `model` (a hub id or a local export)."""
        return {"method": "eagle3", "model": model, "num_speculative_tokens": k}

    def published(self, raw: dict) -> bool:
        """A published draft's config.json `raw` is this kind's (the registry asks the others first)."""
        return True

    # its decoder layers keep their published names `layers.i.` (the importer renames EAGLE-3's
    # `layers.0.` / `midlayer.0.` to `midlayer.`)
    own_layer_names: ClassVar[bool] = False

    def checkpoint_config(self, cfg, dtype) -> dict:
        """The config.json a training checkpoint of `cfg`'s draft carries (train/checkpoint.py): its own
        layout's, `formats[0]`, beside eyas's record."""
        return eagle3_config(cfg, dtype, self)

    def published_config(self, cfg, fmt: str, dtype, k: int, verifier: tuple[str, list[str]] | None) -> dict:
        """The config.json of its layout `fmt` (one of `formats`) for `cfg`'s draft in `dtype`, serving `k`
        drafts; `verifier`: the target's (name, architectures), which the speculators layout names."""
        if fmt == "speculators":
            return speculators_config(cfg, dtype, k, *verifier, self)
        return eagle3_config(cfg, dtype, self)

    def read_published(self, raw: dict, target: str | None, where: str):
        """A DraftConfig from a published config.json `raw` in a layout of its own, ValueError naming what
        eyas cannot read; None: the EAGLE-3 layouts' reader (serve/interchange/importer.py) reads it."""
        return None

    # its own layout writes the vocab map (d2t / t2d) even at the target's whole vocabulary
    always_vocab_map: ClassVar[bool] = True

    def card_options(self, cfg) -> str:
        """The model card's row of the draft's layer options."""
        return (
            f"| options | norm_before_fc {str(cfg.norm_before_fc).lower()}, norm_before_residual "
            f"{str(cfg.norm_before_residual).lower()}, norm_output {str(cfg.norm_output).lower()} "
            "(vLLM llama_eagle3.py) |"
        )

    def card_ids(self, ids: list[int], sglang_ids: list[int]) -> list[str]:
        """The model card's lines on where its layout writes the aux ids `ids` (SGLang reads `sglang_ids`)."""
        return [
            f"- `eagle_aux_hidden_state_layer_ids: {ids}` (top level) — read by vLLM.",
            f"- `eagle_config.eagle_aux_hidden_state_layer_ids: {sglang_ids}` — read by SGLang, "
            "which takes a list starting at 1 as the *output* of decoder layer j (as ModelOpt, SpecForge and "
            "TensorRT-LLM's `eagle3_layers_to_capture` number them) and any other list as these boundary ids "
            "(PR #25454).",
        ]

    def parallel_keys(self, cfg) -> dict[str, Any]:
        """Keys its EAGLE-3-layout config.json adds (a P-EAGLE draft's mask token)."""
        return {}

    def engine_problem(self, engine_label: str) -> str:
        """Why `engine_label`, not one of its `engines`, cannot serve it (one line)."""
        return (
            f"draft kind {self.name}: {engine_label} does not serve it (served by: {', '.join(self.engines)})"
        )


def _resolve(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)
