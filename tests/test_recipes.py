"""Recipe validation: unknown keys, wrong types and impossible values are errors naming the key."""

from pathlib import Path

import pytest
import yaml

from eyas.recipes.load import (
    check_against_target,
    default_aux_layer_ids,
    dump_recipe,
    load_recipe,
    parse_overrides,
)
from eyas.recipes.schema import PromptSource, Recipe, RecipeError

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"


def test_demo_recipe_loads():
    r = load_recipe("demo")
    assert isinstance(r, Recipe) and r.target.model == "eyas-demo"
    assert r.eval.k == 4


@pytest.mark.parametrize(
    "raw,key",
    [
        ({"trian": {}}, "trian"),
        ({"train": {"learning_rate": 1e-3}}, "train.learning_rate"),
        ({"capture": {"aux_layer_ids": [1, 2], "layer": 3}}, "capture.layer"),
    ],
)
def test_unknown_key_is_named(raw, key):
    with pytest.raises(RecipeError, match=rf"^{key}: unknown key"):
        load_recipe(raw)


@pytest.mark.parametrize(
    "raw,key",
    [
        ({"train": {"lr": "fast"}}, "train.lr"),
        ({"train": {"ttt_steps": 2.5}}, "train.ttt_steps"),
        ({"capture": {"aux_layer_ids": [1, "x"]}}, r"capture.aux_layer_ids\[1\]"),
        ({"eval": {"check_lossless": "yes"}}, "eval.check_lossless"),
        ({"data": "prompts.jsonl"}, "data"),
    ],
)
def test_wrong_type_is_named(raw, key):
    with pytest.raises(RecipeError, match=rf"^{key}: expected"):
        load_recipe(raw)


@pytest.mark.parametrize(
    "raw,key",
    [
        ({"eval": {"k": 0}}, "eval.k"),
        ({"train": {"loss": "mse"}}, "train.loss"),
        ({"draft": {"num_layers": 0}}, "draft.num_layers"),
        ({"draft": {"norm_before_fc": "yes"}}, "draft.norm_before_fc"),
        ({"eval": {"concurrency": [1, 0]}}, "eval.concurrency"),
        ({"eval": {"concurrency": []}}, "eval.concurrency"),
        ({"eval": {"temperature": [-0.5]}}, "eval.temperature"),
        ({"eval": {"top_p": 0}}, "eval.top_p"),
        ({"eval": {"tree": ["3,2"]}}, r"eval.tree\[0\]"),
        ({"eval": {"tree": ["3,1,5"]}}, r"eval.tree\[0\]"),  # a chain of 3 verifies 4 tokens
        ({"eval": {"tree": ["2,2,4", "9,2,8"]}, "train": {"ttt_steps": 7}}, r"eval.tree\[1\]"),
        ({"eval": {"k": 8}, "train": {"ttt_steps": 7}}, "eval.k"),
        ({"train": {"ttt_steps": 0}}, "train.ttt_steps"),
        ({"draft": {"kind": "medusa"}}, "draft.kind"),
        ({"draft": {"kind": "peagle"}, "eval": {"tree": ["2,2,4"]}}, "eval.tree"),
        ({"draft": {"kind": "peagle"}, "train": {"ttt_steps": 1}, "eval": {"k": 1}}, "train.ttt_steps"),
        ({"draft": {"mask_token_id": 3}}, "draft.mask_token_id"),
        ({"train": {"cod_ratio": 0}}, "train.cod_ratio"),
        ({"train": {"decay": 1.5}}, "train.decay"),
        ({"capture": {"aux_layer_ids": [2, 2]}}, "capture.aux_layer_ids"),
        ({"capture": {"aux_layer_ids": [-1, 2]}}, "capture.aux_layer_ids"),
        ({"vocab": {"draft_vocab_size": 0}}, "vocab.draft_vocab_size"),
        ({"target": {"dtype": "fp8"}}, "target.dtype"),
        ({"vllm": {"devices": [0], "replicas": 2}}, "vllm.devices"),
        ({"vllm": {"devices": [0, 1, 2], "tensor_parallel_size": 4}}, "vllm.devices"),
        ({"vllm": {"devices": [1, 1]}}, "vllm.devices"),
        ({"vllm": {"tensor_parallel_size": 0}}, "vllm.tensor_parallel_size"),
        ({"vllm": {"gpu_memory_utilization": 1.5}}, "vllm.gpu_memory_utilization"),
        ({"draft": {"sliding_window": 7}, "train": {"ttt_steps": 7}}, "draft.sliding_window"),
        ({"draft": {"sliding_window": 1}}, "draft.sliding_window"),
        ({"train": {"pack": True, "max_length": 512, "pack_length": 1024}}, "train.pack_length"),
        ({"train": {"pack": False, "pack_length": 256}}, "train.pack_length"),
        ({"train": {"sequence_parallel": 0}}, "train.sequence_parallel"),
    ],
)
def test_impossible_value_is_named(raw, key):
    with pytest.raises(RecipeError, match=rf"^{key}: "):
        load_recipe(raw)


def test_checks_against_target():
    r = load_recipe({"capture": {"aux_layer_ids": [2, 18, 37]}})
    with pytest.raises(
        RecipeError,
        match=r"^capture.aux_layer_ids: layer id 37 > the target's 36 layers .*"
        r"id 36 the output of the last layer before the final norm",
    ):
        check_against_target(r, num_layers=36, vocab_size=201088)
    v3 = load_recipe({"capture": {"aux_layer_ids": [24, 30, 36]}})  # nvidia/gpt-oss-120b-Eagle3-v3's ids
    assert check_against_target(v3, num_layers=36, vocab_size=201088) == [24, 30, 36]
    r = load_recipe({"vocab": {"draft_vocab_size": 300000}})
    with pytest.raises(
        RecipeError, match=r"^vocab.draft_vocab_size: 300000 > the target's vocab size 201088"
    ):
        check_against_target(r, num_layers=36, vocab_size=201088)
    assert check_against_target(load_recipe({}), 36, 201088) == [2, 18, 33]  # gpt-oss-120b


def test_default_layer_ids_follow_vllm():
    assert default_aux_layer_ids(36) == [2, 18, 33]  # gpt-oss-120b
    assert default_aux_layer_ids(24) == [2, 12, 21]  # gpt-oss-20b
    assert default_aux_layer_ids(4) == [1, 2, 3]  # tiny: three distinct, in range, not 0


def test_dotted_overrides():
    assert parse_overrides(["train.lr=0.0003", "capture.aux_layer_ids=[1,2,3]", "draft.init_from="]) == {
        "train": {"lr": 3e-4},
        "capture": {"aux_layer_ids": [1, 2, 3]},
        "draft": {"init_from": None},
    }
    r = load_recipe("demo", ["eval.k=3", "train.lr=0.002"])
    assert r.eval.k == 3 and r.train.lr == 0.002
    with pytest.raises(RecipeError, match=r"^eval.kk: unknown key"):
        load_recipe("demo", ["eval.kk=3"])
    # a mapping given whole replaces the recipe's; dotted keys merge into it; an empty one clears it
    recipe = {"eval": {"benchmarks": {"humaneval": "c.jsonl"}}}
    sets = "eval.benchmarks={mt-bench: a.jsonl, gsm8k: b.jsonl}"
    assert load_recipe(recipe, [sets]).eval.benchmarks == {"mt-bench": "a.jsonl", "gsm8k": "b.jsonl"}
    r = load_recipe(recipe, ["eval.benchmarks.gsm8k=b.jsonl"])
    assert r.eval.benchmarks == {"humaneval": "c.jsonl", "gsm8k": "b.jsonl"}
    r = load_recipe(recipe, [sets, "eval.benchmarks.humaneval=d.jsonl"])  # a dotted key after the whole one
    assert r.eval.benchmarks == {"mt-bench": "a.jsonl", "gsm8k": "b.jsonl", "humaneval": "d.jsonl"}
    r = load_recipe("demo", ["train={lr: 0.002}"])  # a whole section too: the rest of it back to the defaults
    assert r.train.lr == 0.002
    assert r.train.epochs == load_recipe({}).train.epochs != load_recipe("demo").train.epochs
    assert (
        load_recipe(
            {"eval": {"benchmarks": {"humaneval": "c.jsonl"}}}, ["eval.benchmarks={}"]
        ).eval.benchmarks
        == {}
    )
    with pytest.raises(RecipeError, match=r"override 'trainlr': expected key.sub=value"):
        load_recipe("demo", ["trainlr"])


def test_shipped_gpt_oss_recipe():
    r = load_recipe("gpt-oss-120b")
    assert r.target.model == "openai/gpt-oss-120b"
    assert check_against_target(r, num_layers=36, vocab_size=201088) == [2, 18, 33]
    assert r.draft.intermediate_size == 17280 and r.vocab.draft_vocab_size == 32000


@pytest.mark.parametrize("model,layers,ids", [("120b", 36, [2, 18, 33]), ("20b", 24, [2, 12, 21])])
def test_shipped_gpt_oss_variants(model, layers, ids):
    """The three variants per target: each parses, fits the target, and differs where its comment says."""
    v = {
        name: load_recipe(f"gpt-oss-{model}-{name}")
        for name in ("short-context", "long-context", "throughput")
    }
    for name, r in v.items():
        assert r.name == f"gpt-oss-{model}-{name}" and r.target.model == f"openai/gpt-oss-{model}"
        assert check_against_target(r, num_layers=layers, vocab_size=201088) == ids
        assert r.train.pack and r.train.attention == "auto" and r.data.temperature == 1.0
        # the budget trend's training choices (docs/benchmarks.md), servable by every engine (no norm_output)
        assert (r.train.optimizer, r.train.lr, r.draft.lm_head, r.draft.norm_output) == (
            "muon",
            3e-3,
            "target_frozen",
            False,
        )
        # vLLM regenerates and captures: one replica per visible GPU
        assert (r.data.backend, r.capture.backend, r.vllm.devices, r.vllm.tensor_parallel_size) == (
            "vllm",
            "vllm",
            None,
            1,
        )
    assert v["short-context"].train.max_length == 8192 and v["short-context"].train.ttt_steps == 5
    assert v["short-context"].eval.k == 3
    assert v["long-context"].train.max_length >= 32768 and v["long-context"].train.checkpoint_layer
    assert v["throughput"].train.ttt_steps < v["short-context"].train.ttt_steps
    assert [v["throughput"].eval.k, *v["throughput"].eval.more_k] == [1, 2]


@pytest.mark.parametrize("name", sorted(p.stem for p in RECIPES.glob("*.yaml")))
def test_shipped_recipes_read_files_inside_the_repository_only(name):
    """Every file a shipped recipe names (data.prompts, eval.benchmarks) exists inside the repository, read
    from its root as the README's commands run: a fresh clone has nothing beside it (data/sets/README.md)."""
    r = load_recipe(name)
    prompts = r.data.prompts if isinstance(r.data.prompts, list) else [PromptSource(r.data.prompts)]
    named = [p.source for p in prompts] + list(r.eval.benchmarks.values())
    # (eyas-demo/...: the demo target's own files, which eyas builds into its cache: data/target.py)
    files = [s for s in named if s.endswith((".jsonl", ".json")) and not s.startswith("eyas-demo/")]
    for f in files:
        path = (ROOT / f).resolve()
        assert path.is_relative_to(ROOT) and path.is_file(), f"{name}: {f}"
    if name.startswith("smollm2"):
        assert files, "the SmolLM2 recipes read the repository's prompt sets"


def test_cli_overrides_after_options(tmp_path, capsys):
    """`eyas <stage> RECIPE --out DIR key=value` and `eyas <stage> RECIPE key=value --out DIR` agree;
    a bad override is a recipe error naming the key, before any work."""
    from eyas.cli import main

    assert main(["prompts", "demo", "--out", str(tmp_path), "--no-progress", "eval.kk=3"]) == 2
    assert "eval.kk: unknown key" in capsys.readouterr().err
    assert main(["prompts", "demo", "eval.k=99", "--out", str(tmp_path)]) == 2
    assert "eval.k: k=99 drafts past what TTT trained" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing was written


MIXED = {
    "prompts": [
        {"source": "HuggingFaceH4/ultrachat_200k", "split": "train_sft", "weight": 3},
        {"source": "data/sets/sharegpt.jsonl", "weight": 1, "name": "sharegpt"},
    ]
}


def test_prompt_sources_list_form():
    r = load_recipe({"data": MIXED})
    a, b = r.data.prompts
    assert (a.source, a.split, a.hub_config, a.weight, a.name, a.label()) == (
        "HuggingFaceH4/ultrachat_200k",
        "train_sft",
        None,
        3.0,
        None,
        "ultrachat_200k",
    )
    assert (b.split, b.weight, b.label()) == ("train", 1.0, "sharegpt")
    assert PromptSource("data/x.jsonl").label() == "x"
    assert load_recipe({}).data.prompts == "eyas-demo/prompts.jsonl"  # the single-string form is unchanged
    assert (
        load_recipe({"data": {"prompts": "d.jsonl", "split": "test", "hub_config": "c"}}).data.split == "test"
    )
    r = load_recipe("demo", ["data.prompts=[{source: a.jsonl, weight: 2}, {source: b.jsonl}]"])
    assert [(s.source, s.weight) for s in r.data.prompts] == [("a.jsonl", 2.0), ("b.jsonl", 1.0)]


def test_prompt_sources_round_trip_through_dump():
    r = load_recipe({"data": {**MIXED, "max_turns": 2}})
    again = load_recipe(yaml.safe_load(dump_recipe(r)))
    assert again == r and isinstance(again.data.prompts[0], PromptSource)
    assert again.to_dict()["data"]["prompts"][1] == {
        "source": "data/sets/sharegpt.jsonl",
        "split": "train",
        "hub_config": None,
        "weight": 1.0,
        "name": "sharegpt",
    }
    assert load_recipe(yaml.safe_load(dump_recipe(load_recipe({})))) == load_recipe({})


@pytest.mark.parametrize(
    "prompts,data,match",
    [
        (
            [{"source": "a.jsonl", "xyz": 1}],
            {},
            r"^data.prompts\[0\].xyz: unknown key \(known: hub_config, name, "
            r"source, split, weight\)",
        ),
        (
            [{"source": "a.jsonl"}, {"source": "b.jsonl", "wieght": 2}],
            {},
            r"^data.prompts\[1\].wieght: unknown key",
        ),
        (
            [{"source": "a.jsonl"}, {"source": "b.jsonl", "weight": 0}],
            {},
            r"^data.prompts\[1\].weight: must be > 0",
        ),
        ([{"source": "a.jsonl", "weight": "heavy"}], {}, r"^data.prompts\[0\].weight: expected a number"),
        ([{"weight": 2}], {}, r"^data.prompts\[0\].source: required"),
        (["a.jsonl"], {}, r"^data.prompts\[0\]: expected a mapping"),
        ([], {}, r"^data.prompts: list at least one source"),
        ({"source": "a.jsonl"}, {}, r"^data.prompts: expected str or list"),
        (
            [{"source": "x/a.jsonl"}, {"source": "y/a.jsonl"}],
            {},
            r"^data.prompts\[1\].name: data.prompts\[0\] \(x/a.jsonl\) and data.prompts\[1\] \(y/a.jsonl\) "
            r"are both "
            r"named 'a'; give one a distinct name",
        ),
        (
            [{"source": "a.jsonl", "name": "a:b"}],
            {},
            r"^data.prompts\[0\].name: must be non-empty and without ':'",
        ),
        (
            [{"source": "org/ds"}],
            {"split": "test"},
            r"^data.split: with a list of data.prompts, put split in each source",
        ),
        (
            [{"source": "org/ds"}],
            {"hub_config": "c"},
            r"^data.hub_config: with a list of data.prompts, put hub_config",
        ),
    ],
)
def test_prompt_sources_errors_name_the_key(prompts, data, match):
    with pytest.raises(RecipeError, match=match):
        load_recipe({"data": {"prompts": prompts, **data}})


def test_max_turns():
    assert load_recipe({}).data.max_turns is None
    assert load_recipe({"data": {"max_turns": 1}}).data.max_turns == 1
    with pytest.raises(RecipeError, match=r"^data.max_turns: must be >= 1"):
        load_recipe({"data": {"max_turns": 0}})
    with pytest.raises(RecipeError, match=r"^data.max_turns: expected an integer"):
        load_recipe({"data": {"max_turns": "all"}})


def test_another_kinds_key_is_named_with_its_kind():
    """The draft section is the kind's own class: a key of another kind, set, names the kinds that have it
    (an override that switches draft.kind on a recipe with EAGLE-3's switches on, say); at false or null it
    is dropped, so the documented `draft.kind=dflash draft.norm_output=false` works; a key no kind has is
    unknown."""
    eagle3 = {"draft": {"norm_output": True, "norm_before_fc": True}}
    with pytest.raises(RecipeError) as e:
        load_recipe(eagle3, ["draft.kind=dflash", "draft.norm_before_fc=false"])
    assert str(e.value) == (
        "draft.norm_output: true is a key of draft.kind eagle3 or peagle, not dflash: remove it (another "
        "kind's key at false or null is dropped)"
    )
    r = load_recipe(eagle3, ["draft.kind=dflash", "draft.norm_before_fc=false", "draft.norm_output=false"])
    assert r.draft.kind == "dflash" and not hasattr(r.draft, "norm_output")
    with pytest.raises(RecipeError, match=r"^draft.block_size: 8 is a key of draft.kind dflash, not eagle3"):
        load_recipe({"draft": {"block_size": 8}})
    with pytest.raises(RecipeError, match=r"^draft.bogus: unknown key for draft.kind eagle3 \(known: "):
        load_recipe({"draft": {"bogus": 1}})


def test_a_kind_switch_refuses_the_old_kinds_defaults(tmp_path):
    """`draft.kind=dflash` over a run's saved recipe.yaml (every key written, EAGLE-3's num_layers: 1 among
    them) is refused, naming the key and both defaults, rather than training a 1-layer DFlash; stated on the
    command line it goes through; a value that is no kind's default is the file's choice and is kept."""
    saved = tmp_path / "recipe.yaml"
    saved.write_text(dump_recipe(load_recipe("demo")))
    with pytest.raises(RecipeError) as e:
        load_recipe(saved, ["draft.kind=dflash", "draft.norm_before_fc=false", "draft.norm_output=false"])
    assert str(e.value) == (
        f"draft.kind=dflash over recipe {saved} (kind eagle3): it holds draft.num_layers: 1 (eagle3's "
        "default; dflash's is 5): give each on the command line (draft.KEY=VALUE), or start from a recipe of "
        "kind dflash"
    )
    over = ["draft.kind=dflash", "draft.norm_before_fc=false", "draft.norm_output=false"]
    over += ["train.block_lengths=random"]  # the demo's eval.k 4 is a shorter block than it trains
    assert load_recipe(saved, [*over, "draft.num_layers=5"]).draft.num_layers == 5
    assert load_recipe({"draft": {"num_layers": 3}}, ["draft.kind=dflash"]).draft.num_layers == 3
    assert load_recipe({}, ["draft.kind=dflash"]).draft.num_layers == 5  # no file key: the kind's own
    # `draft={...}` replaces the file's section whole: nothing of it is kept, so nothing is refused
    assert load_recipe(saved, ["draft={kind: dflash}", over[-1]]).draft.num_layers == 5
