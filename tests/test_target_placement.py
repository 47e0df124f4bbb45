"""The target placed across devices (`target.device_map`): on this CPU machine half of the decoder
layers and the lm_head are offloaded to disk (accelerate's hooks load them for each forward),
which is the code path of a target split over GPUs. Capture and regeneration must not change."""

import pytest
import torch
from data_fixtures import one_thread  # noqa: F401  (fixture)
from test_data_capture import IDS, N_LAYERS, fresh_run, recipe, regen_run, shard_tensors  # noqa: F401

from eyas.data.capture import capture_batch, right_padded, run_capture
from eyas.data.regenerate import read_sequences, run_regenerate
from eyas.data.target import load_target, tapped
from eyas.recipes.schema import load_recipe

pytestmark = pytest.mark.usefixtures("one_thread")


def split_map() -> dict[str, str]:
    """Even layers in RAM, odd layers and the lm_head on disk."""
    m = {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"}
    m.update({f"model.layers.{i}": "disk" if i % 2 else "cpu" for i in range(N_LAYERS)})
    return m


def test_split_placement_captures_hidden_states_exactly(regen_run, tmp_path, capsys):
    target, run = regen_run
    ref_model, _ = load_target(str(target), "float32", "cpu")
    model, _ = load_target(str(target), "float32", device_map=split_map(), offload_folder=str(tmp_path / "off"))
    said = capsys.readouterr().out
    assert ("target: device_map=explicit: layer 0 on cpu, layer 1 on disk, layer 2 on cpu, layer 3 on disk, "
            "layer 4 on cpu, layer 5 on disk; lm_head on disk") in said
    assert model.model.layers[1].mlp.router.weight.device.type == "meta"  # really offloaded
    ids, mask = right_padded([s["input_ids"] for s in read_sequences(run)[:3]])
    with tapped(model, IDS) as tap:
        aux, final, logits = capture_batch(model, tap, ids, mask)
    with torch.no_grad():
        out = ref_model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    for j, k in enumerate(IDS):  # vLLM ids: k = input of decoder layer k = hidden_states[k]
        assert torch.equal(aux[..., j * 64:(j + 1) * 64], out.hidden_states[k]), f"aux layer id {k}"
    assert torch.equal(final, out.hidden_states[N_LAYERS])
    assert torch.equal(logits, out.logits)


@pytest.mark.parametrize("teacher", ["final", "topk"])
def test_capture_stage_with_offloaded_layers_equals_one_device(regen_run, tmp_path, teacher):
    """The whole stage, the top-k teacher included (its lm_head weight is on disk, read from the checkpoint)."""
    target = regen_run[0]
    one, split = fresh_run(regen_run, tmp_path, "one"), fresh_run(regen_run, tmp_path, "split")
    keys = {"teacher": teacher, "teacher_topk": 8} if teacher == "topk" else {}
    run_capture(recipe(target, **keys), one, progress=False)
    r = recipe(target, **keys)
    r.target.device, r.target.device_map, r.target.offload_folder = "auto", split_map(), str(tmp_path / "off")
    run_capture(r, split, progress=False)
    (i1, s1), (i2, s2) = shard_tensors(one), shard_tensors(split)
    assert i1["num_tokens"] == i2["num_tokens"] > 0 and len(s1) == len(s2)
    for a, b in zip(s1, s2):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "shards differ"


def test_planned_placement_offloads_and_regenerates_the_same_tokens(regen_run, tmp_path, capsys):
    """device_map: sequential with a RAM budget smaller than the model: accelerate plans the split
    (the rest on disk) and greedy regeneration (HF generate) gives the same token ids."""
    target, run = regen_run
    base = {"model": str(target), "dtype": "float32"}
    data = {"prompts": str(run.parent / "prompts.jsonl"), "num_eval_prompts": 2, "max_new_tokens": 12}
    planned = load_recipe({"target": {**base, "device_map": "sequential", "max_memory": {"cpu": "800KB"},
                                      "offload_folder": str(tmp_path / "off")}, "data": data})
    split = fresh_run(regen_run, tmp_path, "split")
    (split / "regenerate").rename(split / "regenerate.one")  # regenerate again, with the planned placement
    run_regenerate(planned, split, progress=False)
    said = capsys.readouterr().out
    assert "target: device_map=sequential: layers 0-1 on cpu, layers 2-5 on disk; lm_head on disk" in said
    assert [s["input_ids"] for s in read_sequences(split)] == [s["input_ids"] for s in read_sequences(run)]
