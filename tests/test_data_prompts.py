"""Prompt loading in every supported layout, and the prompts stage's train/eval split."""

import json
from pathlib import Path

import pytest

from eyas.data.prompts import (
    DataFormatError,
    load_conversations,
    prompt_messages,
    quotas,
    read_prompts,
    record_to_conversation,
    run_prompts,
    user_turns,
)
from eyas.infra.errors import InputError
from eyas.infra.layout import read_done
from eyas.recipes.load import load_recipe
from eyas.recipes.schema import RecipeError

SETS = Path(__file__).resolve().parents[1] / "data" / "sets"  # the public prompt sets in the repository


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize(
    "record,expected",
    [
        (
            {
                "messages": [
                    {"role": "system", "content": "S"},
                    {"role": "user", "content": "U"},
                    {"role": "assistant", "content": "A"},
                ]
            },
            [
                {"role": "system", "content": "S"},
                {"role": "user", "content": "U"},
                {"role": "assistant", "content": "A"},
            ],
        ),
        (
            {
                "conversations": [
                    {"from": "system", "value": "S"},
                    {"from": "human", "value": "U"},
                    {"from": "gpt", "value": "A"},
                ]
            },
            [
                {"role": "system", "content": "S"},
                {"role": "user", "content": "U"},
                {"role": "assistant", "content": "A"},
            ],
        ),
        (
            {"messages": ["U1", "A1", "U2"]},
            [
                {"role": "user", "content": "U1"},
                {"role": "assistant", "content": "A1"},
                {"role": "user", "content": "U2"},
            ],
        ),
        (
            {"id": 3, "data": ["U1", "A1"]},
            [{"role": "user", "content": "U1"}, {"role": "assistant", "content": "A1"}],
        ),
        ({"prompt": "P", "completion": "C"}, [{"role": "user", "content": "P"}]),
        ({"question": "Q", "answer": "A"}, [{"role": "user", "content": "Q"}]),
        ({"instruction": "I", "input": "X", "output": "O"}, [{"role": "user", "content": "I\n\nX"}]),
        ({"instruction": "I", "input": ""}, [{"role": "user", "content": "I"}]),
        (
            {"question_id": 1, "turns": ["T1", "T2"]},
            [{"role": "user", "content": "T1"}, {"role": "user", "content": "T2"}],
        ),
    ],
)
def test_layouts_jsonl(tmp_path, record, expected):
    path = write_jsonl(tmp_path / "d.jsonl", [record])
    assert load_conversations(str(path)) == [expected]


def test_json_array_and_wrapped_object(tmp_path):
    recs = [
        {"conversations": [{"from": "user", "value": f"q{i}"}, {"from": "assistant", "value": "a"}]}
        for i in range(3)
    ]
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
    path = write_jsonl(
        tmp_path / "d.jsonl", [{"prompt": "ok"}, {"messages": [{"role": "assistant", "content": "x"}]}]
    )
    with pytest.raises(DataFormatError, match=rf"{path}:2: no non-empty user turn"):
        load_conversations(str(path))
    path = write_jsonl(tmp_path / "e.jsonl", [{"prompt": "ok"}, {"text": "no known field"}])
    with pytest.raises(DataFormatError, match=rf"{path}:2: no conversation found .*got text"):
        load_conversations(str(path))
    (tmp_path / "f.json").write_text(
        json.dumps([{"prompt": "ok"}, {"conversations": [{"from": "alien", "value": "x"}]}])
    )
    with pytest.raises(DataFormatError, match=r"f\.json: record 1: message 0 has an unknown role 'alien'"):
        load_conversations(str(tmp_path / "f.json"))


def test_missing_file_and_unsupported_type(tmp_path):
    with pytest.raises(InputError, match=r"data.prompts=.*nope.jsonl: no such file"):
        load_conversations(str(tmp_path / "nope.jsonl"))
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(DataFormatError, match="unsupported file type '.csv'"):
        load_conversations(str(tmp_path / "d.csv"))


def test_hub_dataset_goes_through_load_dataset(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name, config, split):
        calls.append((name, config, split))
        return datasets.Dataset.from_list(
            [
                {
                    "prompt": "p0",
                    "prompt_id": "x",
                    "messages": [{"role": "user", "content": "u0"}, {"role": "assistant", "content": "a0"}],
                }
            ]
        )

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    convs = load_conversations("HuggingFaceH4/ultrachat_200k", split="train_sft", hub_config=None)
    assert calls == [("HuggingFaceH4/ultrachat_200k", None, "train_sft")]
    assert convs == [[{"role": "user", "content": "u0"}, {"role": "assistant", "content": "a0"}]]


@pytest.mark.parametrize(
    "name,count,first",
    [
        ("sharegpt_format_sample.json", 500, "Who are you?"),
        (
            "mt_bench_questions.jsonl",
            80,
            "Compose an engaging travel blog post about a recent trip to Hawaii, "
            "highlighting cultural experiences and must-see attractions.",
        ),
        ("gsm8k_test.jsonl", 1319, "Janet\u2019s ducks lay 16 eggs per day."),
        ("gsm8k_train.jsonl", 7473, "Natalia sold clips to 48 of her friends in April"),
        ("humaneval.jsonl", 164, "from typing import List\n\n\ndef has_close_elements("),
    ],
)
def test_the_repositorys_prompt_sets(name, count, first):
    """data/sets: each file's record count and first prompt (data/sets/README.md), read as recipes read it."""
    convs = load_conversations(str(SETS / name))
    assert len(convs) == count
    assert prompt_messages(convs[0])[0]["content"].startswith(first)
    assert all(prompt_messages(c)[-1]["role"] == "user" for c in convs)


def test_prompt_messages_keeps_system_and_first_user_turn():
    conv = [
        {"role": "system", "content": "S"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "U1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "U2"},
    ]
    assert prompt_messages(conv) == [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"}]
    assert prompt_messages(conv, system_prompt="R") == [
        {"role": "system", "content": "R"},
        {"role": "user", "content": "U1"},
    ]
    assert prompt_messages(conv[2:]) == [{"role": "user", "content": "U1"}]


def make_recipe(prompts, **data):
    return load_recipe({"data": {"prompts": str(prompts), **data}})


def test_run_prompts_split_dedupe_and_determinism(tmp_path):
    recs = [{"prompt": f"p{i}"} for i in range(50)] + [{"prompt": "p7"}, {"question": "p3"}]  # 2 duplicates
    src = write_jsonl(tmp_path / "d.jsonl", recs)
    stats = run_prompts(
        make_recipe(src, num_prompts=40, num_eval_prompts=8, seed=3), tmp_path / "run", progress=False
    )
    assert (stats["num_records"], stats["num_duplicates"], stats["num_train"], stats["num_eval"]) == (
        52,
        2,
        32,
        8,
    )
    train, evals = read_prompts(tmp_path / "run", "train"), read_prompts(tmp_path / "run", "eval")
    key = lambda p: json.dumps(p["messages"])  # noqa: E731
    assert len(train) == 32 and len(evals) == 8
    assert not {key(p) for p in train} & {key(p) for p in evals}  # eval prompts never trained on
    assert len({key(p) for p in train + evals}) == 40  # deduped
    assert len({p["id"] for p in train + evals}) == 40
    for p in train + evals:  # the id is the source record's index
        assert p["messages"] == [{"role": "user", "content": recs[int(p["id"])].get("prompt", "")}]
    # same seed -> same split; another seed -> another order
    run_prompts(
        make_recipe(src, num_prompts=40, num_eval_prompts=8, seed=3), tmp_path / "run2", progress=False
    )
    assert read_prompts(tmp_path / "run2", "train") == train
    run_prompts(
        make_recipe(src, num_prompts=40, num_eval_prompts=8, seed=4), tmp_path / "run3", progress=False
    )
    assert read_prompts(tmp_path / "run3", "train") != train
    # done: a re-run does nothing and returns the stored stats
    (tmp_path / "run" / "prompts" / "train.jsonl").write_text("")
    assert run_prompts(make_recipe(src), tmp_path / "run", progress=False) == read_done(
        tmp_path / "run", "prompts"
    )
    assert (tmp_path / "run" / "prompts" / "train.jsonl").read_text() == ""


def test_run_prompts_system_prompt_and_too_few(tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i}"} for i in range(5)])
    run_prompts(
        make_recipe(src, num_eval_prompts=2, system_prompt="Be brief."), tmp_path / "run", progress=False
    )
    train = read_prompts(tmp_path / "run", "train")
    assert len(train) == 3 and all(
        p["messages"][0] == {"role": "system", "content": "Be brief."} for p in train
    )
    with pytest.raises(
        RecipeError, match="data.num_eval_prompts: holding out 5 eval prompts leaves no training"
    ):
        run_prompts(make_recipe(src, num_eval_prompts=5), tmp_path / "run2", progress=False)


# --------------------------------------------------------------------------- several sources


def user(text):
    return {"role": "user", "content": text}


def two_sources(tmp_path):
    """a.jsonl: 10 prompts a0..a9; b.jsonl: 7 records, 3 of them duplicates (a1 and a2 as in a.jsonl,
    b0 twice), 4 unique b0..b3."""
    a = write_jsonl(tmp_path / "a.jsonl", [{"prompt": f"a{i}"} for i in range(10)])
    b = write_jsonl(
        tmp_path / "b.jsonl",
        [
            {"prompt": "b0"},
            {"question": "a1"},
            {"prompt": "b1"},
            {"messages": [user("a2"), {"role": "assistant", "content": "x"}]},
            {"prompt": "b2"},
            {"prompt": "b0"},
            {"prompt": "b3"},
        ],
    )
    return a, b


def mixed_recipe(a, b, wa=3, wb=1, **data):
    return load_recipe(
        {
            "data": {
                "prompts": [
                    {"source": str(a), "weight": wa},
                    {"source": str(b), "weight": wb, "name": "bee"},
                ],
                **data,
            }
        }
    )


def test_quotas_largest_remainder():
    assert quotas(8, [3, 1]) == [6, 2]
    assert quotas(10, [1, 1, 1]) == [4, 3, 3]  # ties: the earlier source
    assert quotas(7, [0.5, 0.25, 0.25]) == [3, 2, 2]  # 3.5, 1.75, 1.75: the larger remainders
    assert quotas(100, [1, 2, 3, 4]) == [10, 20, 30, 40]
    assert all(sum(quotas(n, [0.3, 1.7, 2, 5.5])) == n for n in range(1, 60))


def test_mixed_sources_quotas_dedupe_and_ids(tmp_path):
    a, b = two_sources(tmp_path)
    recipe = mixed_recipe(a, b, num_prompts=8, num_eval_prompts=2, seed=5)
    stats = run_prompts(recipe, tmp_path / "run", progress=False)
    train, evals = read_prompts(tmp_path / "run", "train"), read_prompts(tmp_path / "run", "eval")
    assert (stats["num_records"], stats["num_duplicates"], stats["num_train"], stats["num_eval"]) == (
        17,
        3,
        6,
        2,
    )
    assert stats["source"] == [str(a), str(b)]
    assert stats["sources"] == [
        {
            "name": "a",
            "source": str(a),
            "weight": 3.0,
            "num_records": 10,
            "num_duplicates": 0,
            "num_chosen": 6,
        },
        {
            "name": "bee",
            "source": str(b),
            "weight": 1.0,
            "num_records": 7,
            "num_duplicates": 3,
            "num_chosen": 2,
        },
    ]
    rows = train + evals
    by_source = {"a": [], "bee": []}
    texts = {"a": [f"a{i}" for i in range(10)], "bee": ["b0", "a1", "b1", "a2", "b2", "b0", "b3"]}
    for p in rows:  # ids are name:record index
        name, index = p["id"].split(":")
        by_source[name].append(int(index))
        assert p["messages"] == [user(texts[name][int(index)])]
    assert len(by_source["a"]) == 6 and len(by_source["bee"]) == 2
    assert not set(by_source["bee"]) & {1, 3, 5}  # duplicates dropped by the later source (b0 kept at 0)
    assert len({p["id"] for p in rows}) == 8 and len({json.dumps(p["messages"]) for p in rows}) == 8
    # deterministic: the same recipe gives the same files; another seed another draw
    run_prompts(
        mixed_recipe(a, b, num_prompts=8, num_eval_prompts=2, seed=5), tmp_path / "run2", progress=False
    )
    assert (
        read_prompts(tmp_path / "run2", "train") == train and read_prompts(tmp_path / "run2", "eval") == evals
    )
    run_prompts(
        mixed_recipe(a, b, num_prompts=8, num_eval_prompts=2, seed=6), tmp_path / "run3", progress=False
    )
    assert read_prompts(tmp_path / "run3", "train") + read_prompts(tmp_path / "run3", "eval") != rows


def test_mixed_sources_all_prompts_without_num_prompts(tmp_path, capsys):
    a, b = two_sources(tmp_path)
    stats = run_prompts(mixed_recipe(a, b, num_eval_prompts=3), tmp_path / "run", progress=True)
    assert (stats["num_train"], stats["num_eval"]) == (11, 3)  # 10 + 4 unique: weights do not matter
    assert [e["num_chosen"] for e in stats["sources"]] == [10, 4]
    assert "weights do not matter" in capsys.readouterr().out
    rows = read_prompts(tmp_path / "run", "train") + read_prompts(tmp_path / "run", "eval")
    assert sorted(p["id"] for p in rows) == sorted(
        [f"a:{i}" for i in range(10)] + ["bee:0", "bee:2", "bee:4", "bee:6"]
    )


def test_mixed_sources_short_source_is_an_error(tmp_path):
    a, b = two_sources(tmp_path)
    with pytest.raises(
        RecipeError,
        match=rf"^data.prompts\[1\] \(bee, {b}\): 4 unique prompts \(7 records, "
        rf"3 duplicates\), fewer than its quota of 6 \(data.num_prompts=12 x "
        rf"weight 1 / total weight 2\); lower its weight or data.num_prompts",
    ):
        run_prompts(
            mixed_recipe(a, b, wa=1, wb=1, num_prompts=12, num_eval_prompts=2),
            tmp_path / "run",
            progress=False,
        )
    assert not (tmp_path / "run" / "prompts" / "train.jsonl").exists()


def test_mixed_sources_resolve_each_path(tmp_path, monkeypatch):
    import eyas.data.prompts as prompts_mod

    a, b = two_sources(tmp_path)
    monkeypatch.setattr(prompts_mod, "resolve_path", lambda name: str(tmp_path / name))
    recipe = load_recipe(
        {"data": {"prompts": [{"source": "a.jsonl"}, {"source": "b.jsonl"}], "num_eval_prompts": 1}}
    )
    stats = run_prompts(recipe, tmp_path / "run", progress=False)
    assert stats["source"] == [str(a), str(b)] and [e["name"] for e in stats["sources"]] == ["a", "b"]


def test_single_source_stats_keep_their_keys(tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i}"} for i in range(6)] + [{"prompt": "p0"}])
    stats = run_prompts(make_recipe(src, num_eval_prompts=2), tmp_path / "run", progress=False)
    assert stats["source"] == str(src)
    assert {
        k: stats[k]
        for k in (
            "num_records",
            "num_duplicates",
            "num_train",
            "num_eval",
            "num_turns",
            "max_turns_seen",
            "num_eval_overlap",
        )
    } == {
        "num_records": 7,
        "num_duplicates": 1,
        "num_train": 4,
        "num_eval": 2,
        "num_turns": 4,
        "max_turns_seen": 1,
        "num_eval_overlap": 0,
    }
    assert stats["sources"] == [
        {
            "name": "d",
            "source": str(src),
            "weight": 1.0,
            "num_records": 7,
            "num_duplicates": 1,
            "num_chosen": 6,
        }
    ]
    assert sorted(
        p["id"] for p in read_prompts(tmp_path / "run", "train") + read_prompts(tmp_path / "run", "eval")
    ) == [str(i) for i in range(6)]


# --------------------------------------------------------------------------- multi-turn prompts

SHAREGPT_3 = {
    "conversations": [
        {"from": "system", "value": "S"},
        {"from": "human", "value": "u1"},
        {"from": "gpt", "value": "g1"},
        {"from": "human", "value": "u2"},
        {"from": "gpt", "value": "g2"},
        {"from": "human", "value": "u3"},
        {"from": "gpt", "value": "g3"},
    ]
}
OPENAI_3 = {
    "messages": [
        {"role": "system", "content": "T"},
        user("v1"),
        {"role": "assistant", "content": "o1"},
        user("v2"),
        {"role": "assistant", "content": "o2"},
        user("  "),
        user("v3"),
    ]
}


def test_user_turns_keeps_every_user_turn_in_order():
    conv = record_to_conversation(SHAREGPT_3, "x")
    sys_s = {"role": "system", "content": "S"}
    assert user_turns(conv) == [sys_s, user("u1"), user("u2"), user("u3")]
    assert user_turns(conv, max_turns=2) == [sys_s, user("u1"), user("u2")]
    assert user_turns(conv, max_turns=1) == prompt_messages(conv)
    assert user_turns(conv, system_prompt="R")[0] == {"role": "system", "content": "R"}
    conv = record_to_conversation(OPENAI_3, "y")  # a blank user turn is skipped
    assert user_turns(conv) == [{"role": "system", "content": "T"}, user("v1"), user("v2"), user("v3")]
    assert user_turns([user("q")]) == [user("q")]


@pytest.mark.parametrize("max_turns,want", [(None, 3), (2, 2), (1, 1)])
def test_run_prompts_multi_turn_train_rows(tmp_path, max_turns, want):
    src = write_jsonl(tmp_path / "d.jsonl", [SHAREGPT_3, OPENAI_3] + [{"prompt": f"p{i}"} for i in range(4)])
    stats = run_prompts(
        make_recipe(src, num_eval_prompts=0, max_turns=max_turns), tmp_path / "run", progress=False
    )
    train = {p["id"]: p["messages"] for p in read_prompts(tmp_path / "run", "train")}
    assert train["0"] == [{"role": "system", "content": "S"}] + [user(f"u{i}") for i in range(1, want + 1)]
    assert train["1"] == [{"role": "system", "content": "T"}] + [user(f"v{i}") for i in range(1, want + 1)]
    assert not any(m["role"] == "assistant" for msgs in train.values() for m in msgs)
    assert (stats["num_turns"], stats["max_turns_seen"]) == (2 * want + 4, want)


def test_run_prompts_multi_turn_eval_rows_are_single_turn(tmp_path):
    recs = [
        {
            "conversations": [
                {"from": "human", "value": f"q{i} {t}"} if j % 2 == 0 else {"from": "gpt", "value": "a"}
                for j, t in enumerate(range(6))
            ]
        }
        for i in range(10)
    ]
    src = write_jsonl(tmp_path / "d.jsonl", recs)
    stats = run_prompts(
        make_recipe(src, num_eval_prompts=4, system_prompt="B"), tmp_path / "run", progress=False
    )
    train, evals = read_prompts(tmp_path / "run", "train"), read_prompts(tmp_path / "run", "eval")
    assert (stats["num_train"], stats["num_eval"], stats["num_turns"]) == (6, 4, 18)
    assert not {p["id"] for p in train} & {p["id"] for p in evals}  # a conversation is train or eval
    for p in evals:
        assert p["messages"] == [{"role": "system", "content": "B"}, user(f"q{p['id']} 0")]
    for p in train:
        assert p["messages"] == [{"role": "system", "content": "B"}] + [
            user(f"q{p['id']} {t}") for t in (0, 2, 4)
        ]


def test_run_prompts_never_trains_on_an_eval_prompt(tmp_path):
    """Conversations that share a first turn and differ later are distinct training prompts; one that
    starts with a held-out prompt is dropped from train."""
    recs = [{"messages": ["same", "a", f"then {i}"]} for i in range(3)] + [
        {"prompt": f"p{i}"} for i in range(9)
    ]
    src = write_jsonl(tmp_path / "d.jsonl", recs)
    overlaps = set()
    for seed in range(8):
        run = tmp_path / f"run{seed}"
        stats = run_prompts(make_recipe(src, num_eval_prompts=3, seed=seed), run, progress=False)
        train, evals = read_prompts(run, "train"), read_prompts(run, "eval")
        assert stats["num_duplicates"] == 0 and len(evals) == 3
        assert len({json.dumps(p["messages"]) for p in evals}) == 3
        firsts = {json.dumps(p["messages"][:1]) for p in train}
        assert not firsts & {json.dumps(p["messages"]) for p in evals}
        assert len(train) + len(evals) + stats["num_eval_overlap"] == 12
        overlaps.add(stats["num_eval_overlap"])
    assert overlaps > {0}  # some seed held out a "same" conversation and dropped the other two
