"""Prompt loading in every supported layout, and the prompts stage's train/eval split."""

import json
from pathlib import Path

import pytest

from eyas.data.prompts import DataFormatError, load_conversations, prompt_messages, read_prompts, run_prompts
from eyas.io import read_done
from eyas.recipes.schema import RecipeError, load_recipe

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} not present")


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("record,expected", [
    ({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                   {"role": "assistant", "content": "A"}]},
     [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]),
    ({"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "U"},
                        {"from": "gpt", "value": "A"}]},
     [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]),
    ({"messages": ["U1", "A1", "U2"]},
     [{"role": "user", "content": "U1"}, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"}]),
    ({"id": 3, "data": ["U1", "A1"]}, [{"role": "user", "content": "U1"}, {"role": "assistant", "content": "A1"}]),
    ({"prompt": "P", "completion": "C"}, [{"role": "user", "content": "P"}]),
    ({"question": "Q", "answer": "A"}, [{"role": "user", "content": "Q"}]),
    ({"instruction": "I", "input": "X", "output": "O"}, [{"role": "user", "content": "I\n\nX"}]),
    ({"instruction": "I", "input": ""}, [{"role": "user", "content": "I"}]),
    ({"question_id": 1, "turns": ["T1", "T2"]}, [{"role": "user", "content": "T1"}]),
])
def test_layouts_jsonl(tmp_path, record, expected):
    path = write_jsonl(tmp_path / "d.jsonl", [record])
    assert load_conversations(str(path)) == [expected]


def test_json_array_and_wrapped_object(tmp_path):
    recs = [{"conversations": [{"from": "user", "value": f"q{i}"}, {"from": "assistant", "value": "a"}]}
            for i in range(3)]
    (tmp_path / "a.json").write_text(json.dumps(recs))
    (tmp_path / "o.json").write_text(json.dumps({"version": 1, "data": recs}))
    want = [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}] for i in range(3)]
    assert load_conversations(str(tmp_path / "a.json")) == want
    assert load_conversations(str(tmp_path / "o.json")) == want


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n{"prompt": oops}\n')
    with pytest.raises(ValueError, match=rf"{path}:4: not valid JSON"):
        load_conversations(str(path))


def test_record_without_user_turn_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "ok"}, {"messages": [{"role": "assistant", "content": "x"}]}])
    with pytest.raises(DataFormatError, match=rf"{path}:2: no non-empty user turn"):
        load_conversations(str(path))
    path = write_jsonl(tmp_path / "e.jsonl", [{"prompt": "ok"}, {"text": "no known field"}])
    with pytest.raises(DataFormatError, match=rf"{path}:2: no conversation found .*got text"):
        load_conversations(str(path))
    (tmp_path / "f.json").write_text(json.dumps([{"prompt": "ok"}, {"conversations": [{"from": "alien", "value": "x"}]}]))
    with pytest.raises(DataFormatError, match=r"f\.json: record 1: message 0 has an unknown role 'alien'"):
        load_conversations(str(tmp_path / "f.json"))


def test_missing_file_and_unsupported_type(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_conversations(str(tmp_path / "nope.jsonl"))
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(DataFormatError, match="unsupported file type '.csv'"):
        load_conversations(str(tmp_path / "d.csv"))


def test_hub_dataset_goes_through_load_dataset(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name, config, split):
        calls.append((name, config, split))
        return datasets.Dataset.from_list([{"prompt": "p0", "prompt_id": "x",
                                            "messages": [{"role": "user", "content": "u0"},
                                                         {"role": "assistant", "content": "a0"}]}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    convs = load_conversations("HuggingFaceH4/ultrachat_200k", split="train_sft", hub_config=None)
    assert calls == [("HuggingFaceH4/ultrachat_200k", None, "train_sft")]
    assert convs == [[{"role": "user", "content": "u0"}, {"role": "assistant", "content": "a0"}]]


@needs_shared
@pytest.mark.parametrize("name,count,first", [
    ("sharegpt_format_sample.json", 500, "Who are you?"),
    ("mt_bench_questions.jsonl", 80, "Compose an engaging travel blog post about a recent trip to Hawaii, "
                                     "highlighting cultural experiences and must-see attractions."),
    ("gsm8k_test.jsonl", 1319, "Janet\u2019s ducks lay 16 eggs per day."),
    ("humaneval.jsonl", 164, "from typing import List\n\n\ndef has_close_elements("),
])
def test_real_shared_files(name, count, first):
    convs = load_conversations(str(SHARED / name))
    assert len(convs) == count
    assert prompt_messages(convs[0])[0]["content"].startswith(first)
    assert all(prompt_messages(c)[-1]["role"] == "user" for c in convs)


def test_prompt_messages_keeps_system_and_first_user_turn():
    conv = [{"role": "system", "content": "S"}, {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "U1"}, {"role": "assistant", "content": "A1"},
            {"role": "user", "content": "U2"}]
    assert prompt_messages(conv) == [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"}]
    assert prompt_messages(conv, system_prompt="R") == [{"role": "system", "content": "R"},
                                                        {"role": "user", "content": "U1"}]
    assert prompt_messages(conv[2:]) == [{"role": "user", "content": "U1"}]


def make_recipe(prompts, **data):
    return load_recipe({"data": {"prompts": str(prompts), **data}})


def test_run_prompts_split_dedupe_and_determinism(tmp_path):
    recs = [{"prompt": f"p{i}"} for i in range(50)] + [{"prompt": "p7"}, {"question": "p3"}]  # 2 duplicates
    src = write_jsonl(tmp_path / "d.jsonl", recs)
    stats = run_prompts(make_recipe(src, num_prompts=40, num_eval_prompts=8, seed=3), tmp_path / "run", progress=False)
    assert (stats["num_records"], stats["num_duplicates"], stats["num_train"], stats["num_eval"]) == (52, 2, 32, 8)
    train, evals = read_prompts(tmp_path / "run", "train"), read_prompts(tmp_path / "run", "eval")
    key = lambda p: json.dumps(p["messages"])  # noqa: E731
    assert len(train) == 32 and len(evals) == 8
    assert not {key(p) for p in train} & {key(p) for p in evals}  # eval prompts never trained on
    assert len({key(p) for p in train + evals}) == 40  # deduped
    assert len({p["id"] for p in train + evals}) == 40
    for p in train + evals:  # the id is the source record's index
        assert p["messages"] == [{"role": "user", "content": recs[int(p["id"])].get("prompt", "")}]
    # same seed -> same split; another seed -> another order
    run_prompts(make_recipe(src, num_prompts=40, num_eval_prompts=8, seed=3), tmp_path / "run2", progress=False)
    assert read_prompts(tmp_path / "run2", "train") == train
    run_prompts(make_recipe(src, num_prompts=40, num_eval_prompts=8, seed=4), tmp_path / "run3", progress=False)
    assert read_prompts(tmp_path / "run3", "train") != train
    # done: a re-run does nothing and returns the stored stats
    (tmp_path / "run" / "prompts" / "train.jsonl").write_text("")
    assert run_prompts(make_recipe(src), tmp_path / "run", progress=False) == read_done(tmp_path / "run", "prompts")
    assert (tmp_path / "run" / "prompts" / "train.jsonl").read_text() == ""


def test_run_prompts_system_prompt_and_too_few(tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i}"} for i in range(5)])
    run_prompts(make_recipe(src, num_eval_prompts=2, system_prompt="Be brief."), tmp_path / "run", progress=False)
    train = read_prompts(tmp_path / "run", "train")
    assert len(train) == 3 and all(p["messages"][0] == {"role": "system", "content": "Be brief."} for p in train)
    with pytest.raises(RecipeError, match="data.num_eval_prompts: holding out 5 eval prompts leaves no training"):
        run_prompts(make_recipe(src, num_eval_prompts=5), tmp_path / "run2", progress=False)
