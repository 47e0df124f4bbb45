"""`eyas publish`: dry-run folder with a model card of the run's measurements; hub calls; token errors."""

import json
import os
from pathlib import Path

import huggingface_hub
import pytest
import yaml
from test_export_support import fabricate_run, make_draft, tiny_target

from eyas.cli import main
from eyas.model_card import front_matter
from eyas.publish import PublishError, main_publish, publish


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    return fabricate_run(root, make_draft(0, tiny_target(root)))


def card_of(folder):
    text = (folder / "README.md").read_text()
    _, meta, body = text.split("---\n", 2)
    return yaml.safe_load(meta), body


def test_dry_run_builds_the_folder(run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)  # a dry run needs no token
    assert (
        main_publish([str(run), "--repo", "acme/tiny-eagle3", "--dry-run", "--out", str(tmp_path / "f")]) == 0
    )
    folder = tmp_path / "f"
    assert capsys.readouterr().out.strip() == str(folder)
    assert {p.name for p in folder.iterdir()} == {
        "README.md",
        "config.json",
        "model.safetensors",
        "eyas_report.json",
        "recipe.yaml",
    }
    meta, body = card_of(folder)
    assert meta["tags"][:3] == ["speculative-decoding", "eagle3", "eyas"] and meta["license"] == "apache-2.0"
    assert "library_name" in meta and "base_model" not in meta  # the tiny target is a local path
    assert (
        "| eyas | held-out | 0 | 1 | k=4 | 3.14 | 0.91 / 0.74 / 0.55 / 0.38 | 32 | yes | 88.5 | 41.2 "
        "| 2.15× |" in body
    )
    assert (
        "| eyas | mt-bench | 0 | 1 | k=4 | 2.72 | 0.85 / 0.62 / 0.41 / 0.25 | 80 | yes | 70.1 | 41.2 "
        "| 1.70× |" in body
    )
    # the eval's recommendation per concurrency level
    assert "## Which k at which concurrency" in body
    assert "| eyas | held-out | 0 | 1 | k=3 | 1.80× | 1.75× | 3.20 |" in body
    assert "| eyas | held-out | 0 | 64 | no speculation | 1.00× | — | 1.00 |" in body
    assert '"method": "eagle3", "model": "acme/tiny-eagle3", "num_speculative_tokens": 4' in body
    assert "--speculative-num-steps 4 --speculative-eagle-topk 1 --speculative-num-draft-tokens 5" in body
    assert "eagle3_layers_to_capture: [1, 3, 5]" in body and "max_draft_len: 4" in body
    assert "`train.ttt_steps`: 7" in body and "final_loss=1.234" in body
    assert json.loads((folder / "eyas_report.json").read_text())["acceptance_length"] == 3.1416
    config = json.loads((folder / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 6]


def test_upload_calls(run, tmp_path, monkeypatch):
    calls = {}
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_test")

    def create_repo(self, repo_id, **kw):
        calls["create_repo"] = (repo_id, kw)
        return f"https://huggingface.co/{repo_id}"

    def create_branch(self, repo_id, **kw):
        calls["create_branch"] = (repo_id, kw)

    def upload_folder(self, **kw):
        calls["upload_folder"] = kw
        calls["files"] = sorted(p.name for p in Path(kw["folder_path"]).iterdir())

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_branch", create_branch)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    published = publish(run, "acme/tiny-eagle3", private=True, revision="exp-1", out=tmp_path / "f")
    assert calls["create_repo"] == (
        "acme/tiny-eagle3",
        {"private": True, "exist_ok": True, "repo_type": "model"},
    )
    assert calls["create_branch"] == (
        "acme/tiny-eagle3",
        {"branch": "exp-1", "exist_ok": True, "repo_type": "model"},
    )
    assert calls["upload_folder"]["repo_id"] == "acme/tiny-eagle3"
    assert calls["upload_folder"]["revision"] == "exp-1"
    assert calls["files"] == [
        "README.md",
        "config.json",
        "eyas_report.json",
        "model.safetensors",
        "recipe.yaml",
    ]
    assert published.url == "https://huggingface.co/acme/tiny-eagle3/tree/exp-1"


def test_no_branch_without_revision(run, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_test")
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, repo_id, **kw: "u")
    monkeypatch.setattr(huggingface_hub.HfApi, "create_branch", lambda self, *a, **kw: calls.append("branch"))
    monkeypatch.setattr(
        huggingface_hub.HfApi, "upload_folder", lambda self, **kw: calls.append(kw["revision"])
    )
    publish(run, "acme/tiny-eagle3", out=tmp_path / "f")
    assert calls == [None]


def test_missing_token_is_a_clear_error(run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(PublishError, match="hf auth login.*HF_TOKEN"):
        publish(run, "acme/tiny-eagle3", out=tmp_path / "f")
    assert not (tmp_path / "f").exists()  # checked before any work
    assert main(["publish", str(run), "--repo", "acme/tiny-eagle3"]) == 2
    assert "huggingface-cli login" in capsys.readouterr().err


def test_bad_repo_and_unfinished_run(run, tmp_path):
    with pytest.raises(PublishError, match="expected ORG/NAME"):
        publish(run, "no-org", dry_run=True)
    with pytest.raises(FileNotFoundError, match="no final checkpoint"):
        publish(tmp_path, "acme/x", dry_run=True)


def test_front_matter_names_a_hub_base_model():
    meta = yaml.safe_load(front_matter("openai/gpt-oss-120b", ("vllm", "sglang"), "apache-2.0").strip("-\n"))
    assert meta["base_model"] == "openai/gpt-oss-120b" and meta["tags"][-2:] == ["vllm", "sglang"]


def test_card_names_the_data_temperature_and_effort_weights():
    from eyas.model_card import _recipe_facts

    facts = _recipe_facts(
        {"data": {"temperature": 1.0, "reasoning_effort": {"low": 4, "medium": 4, "high": 2}}}
    )
    assert facts == [
        "- `data.temperature`: 1.0",
        "- `data.reasoning_effort`: {'low': 4, 'medium': 4, 'high': 2}",
    ]


def test_a_temporary_folder_is_removed_after_the_upload_and_kept_after_a_dry_run(run, tmp_path, monkeypatch):
    """Without --out the folder is built in a temporary directory: an upload removes it once the hub has it
    (at gpt-oss-120b's widths it holds gigabytes), a dry run keeps it (its path is what it prints)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_test")
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, repo_id, **kw: "u")
    seen = []
    monkeypatch.setattr(
        huggingface_hub.HfApi,
        "upload_folder",
        lambda self, **kw: seen.append(sorted(os.listdir(kw["folder_path"]))),
    )
    published = publish(run, "acme/tiny-eagle3")
    assert seen and "model.safetensors" in seen[0] and published.folder is None
    assert not list(tmp_path.glob("eyas-publish-*"))
    dry = publish(run, "acme/tiny-eagle3", dry_run=True)
    assert dry.folder.is_dir() and dry.folder.parent.name.startswith("eyas-publish-")
