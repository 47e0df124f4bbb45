"""Issue #11: the hub token never shows up in logs, run dirs, model cards, reports or error messages.

`eyas publish` runs as a subprocess, with a known fake HF_TOKEN, against a local stand-in of the
hub's HTTP API (tests/hub_standin.py). Its HOME, HF_HOME, TMPDIR, EYAS_CACHE and working directory
are all under the test's tmp dir, so everything it (or huggingface_hub, hf_xet) writes is there:
every file under the tmp dir, and its stdout and stderr, are searched for the token and for its
base64 form (at each of the three alignments). The requests the stand-in received are checked too:
the token only in the Authorization header, and never sent to the LFS storage URL.

Publishing succeeds through both of huggingface_hub's upload paths (hf_xet installed: every file
inline in the commit; HF_HUB_DISABLE_XET=1: model.safetensors through the LFS "basic" transfer),
and fails with a 403 on the commit whose message repeats the token (the one-line error must mask
it) and with a 500 on create_repo.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hub_standin import hub_standin
from test_export_support import fabricate_run, make_draft, tiny_target

TOKEN = "hf_FAKEtoken0123456789abcdefSECRET"
REPO = "acme/tiny-eagle3"
FILES = {"README.md", "config.json", "model.safetensors", "eyas_report.json", "recipe.yaml"}


def token_forms(token: str = TOKEN) -> dict[str, bytes]:
    """The token, and its base64 at each alignment: wherever it sits in an encoded stream, the
    characters that encode only token bytes are one of these three (standard or URL-safe)."""
    raw = token.encode()
    forms = {"token": raw}
    for k in range(3):
        part = raw[k : len(raw) - (len(raw) - k) % 3]
        forms[f"base64@{k}"] = base64.b64encode(part)
        forms[f"urlsafe-base64@{k}"] = base64.urlsafe_b64encode(part)
    return forms


FORMS = token_forms()


def leaks(blob: bytes) -> list[str]:
    return [name for name, form in FORMS.items() if form in blob]


def scan_tree(root: Path) -> dict[str, list[str]]:
    """{file: token forms found} for every regular file under `root` (links not followed)."""
    found = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                hit = leaks(path.read_bytes())
                if hit:
                    found[str(path.relative_to(root))] = hit
    return found


def assert_nothing_leaked(tmp_path: Path, proc: subprocess.CompletedProcess, hub) -> None:
    assert not leaks(proc.stdout), f"token in stdout:\n{proc.stdout.decode(errors='replace')}"
    assert not leaks(proc.stderr), f"token in stderr:\n{proc.stderr.decode(errors='replace')}"
    found = scan_tree(tmp_path)
    assert not found, f"token in files under {tmp_path}: {found}"
    # what went over the wire: the token in the Authorization header and nowhere else
    for r in hub.requests:
        where = [
            f"{r.method} {r.path}?{r.query}" if leaks(f"{r.path}?{r.query}".encode()) else None,
            "body" if leaks(r.body) else None,
        ]
        where += [f"header {k}" for k, v in r.headers if k != "authorization" and leaks(v.encode())]
        assert not any(where), f"token in {r.endpoint} request: {[w for w in where if w]}"


@pytest.fixture
def run(tmp_path):
    root = tmp_path / "run"
    return fabricate_run(root, make_draft(0, tiny_target(root)))


def publish_cli(tmp_path: Path, run: Path, hub, *args: str, xet: bool = True) -> subprocess.CompletedProcess:
    """`eyas publish RUN --repo REPO --out tmp/folder ARGS` in a subprocess writing only under tmp_path."""
    # no inherited hub settings (a real token, HF_HUB_OFFLINE, ...), cache dirs or EYAS_DEBUG (--debug)
    dropped = ("MPLCONFIGDIR", "EYAS_DEBUG")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HF_", "HUGGING_FACE", "HUGGINGFACE", "XDG_")) and k not in dropped
    }
    dirs = {name: tmp_path / name for name in ("home", "hf-home", "tmp", "eyas-cache", "cwd")}
    for d in dirs.values():
        d.mkdir(exist_ok=True)
    no_proxy = ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1,localhost"]))
    env.update(
        HF_TOKEN=TOKEN,
        HF_ENDPOINT=hub.url,
        HF_HOME=str(dirs["hf-home"]),
        HF_HUB_DISABLE_TELEMETRY="1",
        HOME=str(dirs["home"]),
        TMPDIR=str(dirs["tmp"]),
        EYAS_CACHE=str(dirs["eyas-cache"]),
        NO_PROXY=no_proxy,
        no_proxy=no_proxy,
    )
    if not xet:
        env["HF_HUB_DISABLE_XET"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "eyas.cli",
        "publish",
        str(run),
        "--repo",
        REPO,
        "--out",
        str(tmp_path / "folder"),
        *args,
    ]
    return subprocess.run(cmd, env=env, cwd=dirs["cwd"], capture_output=True, timeout=300)


def assert_token_was_sent(hub) -> None:
    """Every hub API call carried `Authorization: Bearer TOKEN`; the LFS storage PUTs carried none."""
    assert hub.requests
    for r in hub.requests:
        expected = None if r.endpoint == "lfs_upload" else f"Bearer {TOKEN}"
        assert r.header("authorization") == expected, f"{r.endpoint} {r.method} {r.path}"
    assert not hub.calls("unhandled"), [
        (r.method, r.path) for r in hub.calls("unhandled")
    ]  # no xet endpoints


@pytest.mark.parametrize("xet", [True, False], ids=["hf_xet-regular", "no-xet-lfs-basic"])
def test_publish_uses_the_token_and_writes_it_nowhere(run, tmp_path, xet):
    # hf_xet installed (the default): huggingface_hub's pipelined upload, every file "regular" (inline);
    # HF_HUB_DISABLE_XET=1: the legacy commit, model.safetensors through the LFS "basic" transfer.
    with hub_standin(lfs=not xet) as hub:
        proc = publish_cli(tmp_path, run, hub, "--revision", "exp-1", xet=xet)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert proc.stdout.decode().strip().splitlines()[-1] == f"{hub.url}/{REPO}/tree/exp-1"
    assert_token_was_sent(hub)
    assert [len(hub.calls(e)) for e in ("create_repo", "create_branch", "commit")] == [1, 1, 1]
    folder = tmp_path / "folder"
    assert {p.name for p in folder.iterdir()} == FILES
    assert hub.files(REPO, "exp-1") == {p.name: p.read_bytes() for p in folder.iterdir()}
    if xet:
        assert not hub.calls("lfs_batch") and not hub.lfs_objects
    else:
        assert [r.status for r in hub.calls("lfs_upload")] == [200]
        assert list(hub.lfs_objects.values()) == [(folder / "model.safetensors").read_bytes()]
    assert_nothing_leaked(tmp_path, proc, hub)


@pytest.mark.parametrize(
    "endpoint,status,echo,debug,exit_status",
    [("commit", 403, True, False, 2), ("commit", 403, True, True, 2), ("create_repo", 500, False, False, 1)],
    ids=["commit-403-naming-the-token", "commit-403-naming-the-token-debug", "create_repo-500"],
)
def test_failed_publish_prints_no_token(run, tmp_path, endpoint, status, echo, debug, exit_status):
    # echo: the 403 names the token it refused (a mirror or proxy may): the one-line error must mask it, and
    # so must the traceback --debug adds. A refusal is the token's rights (exit 2), a 500 the hub's (exit 1).
    message = f"token {TOKEN} may not write to {REPO}" if echo else None
    with hub_standin() as hub:
        hub.fail(endpoint, status, message)
        proc = publish_cli(tmp_path, run, hub, "--revision", "exp-1", *(["--debug"] if debug else []))
    assert proc.returncode == exit_status, proc.stderr.decode(errors="replace")
    err = proc.stderr.decode().strip().splitlines()
    assert err[-1].startswith(f"eyas: error: --repo {REPO}: ") and ("Traceback" in err[0]) == debug
    if echo:
        assert "may not write" in err[-1] and "***" in err[-1]  # the hub's words, the token masked
    assert [r.status for r in hub.calls(endpoint)] == [status]  # the failure did happen, with the token sent
    assert_token_was_sent(hub)
    if endpoint == "create_repo":
        assert not hub.has_repo(REPO) and len(hub.requests) == 1
    else:
        assert hub.files(REPO, "exp-1") == {}
    assert_nothing_leaked(tmp_path, proc, hub)
