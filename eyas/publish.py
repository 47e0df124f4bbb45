"""`eyas publish`: a run's draft on the Hugging Face Hub, with a model card of its measurements.

    eyas publish RUN --repo ORG/NAME [--private] [--revision BRANCH] [--dry-run] [--out DIR]

The folder uploaded is the eagle3 export of RUN/train/checkpoint-final (checked for vLLM,
SGLang and TensorRT-LLM, re-read by eyas), README.md (eyas/model_card.py), and the run's
report.json (as eyas_report.json) and recipe.yaml. The token is huggingface_hub's usual one
(HF_TOKEN, or the one `hf auth login` stored); it is checked before any work. `--dry-run`
builds the folder, uploads nothing and prints its path.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from eyas.infra.errors import InputError, RunError, as_input
from eyas.infra.layout import load_run
from eyas.model_card import HUB_ID, render_model_card
from eyas.serve.interchange.export import export
from eyas.train.checkpoint import read_config
from eyas.train.kinds import kind_named


class PublishError(InputError, ValueError):
    """Publishing cannot proceed; the message says what to do."""


@dataclass
class Published:
    folder: Path | None  # the folder built; None after an upload from a temporary one (removed)
    url: str | None  # None for a dry run


def hub_token() -> str:
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        raise PublishError(
            "no Hugging Face token: run `hf auth login` (formerly `huggingface-cli login`) "
            "or set HF_TOKEN, then publish again (or use --dry-run to only build the folder)"
        )
    return token


def publish(
    run: str | Path,
    repo: str,
    private: bool = False,
    revision: str | None = None,
    dry_run: bool = False,
    out: str | Path | None = None,
    license: str = "apache-2.0",
    num_speculative_tokens: int | None = None,
    engines: tuple[str, ...] | list[str] | None = None,
) -> Published:
    """Build the folder for `repo` from `run` and upload it (unless `dry_run`).

    `num_speculative_tokens` (default: the report's k, else 3) goes into the serving commands."""
    if not HUB_ID.match(repo):
        raise PublishError(f"--repo {repo!r}: expected ORG/NAME")
    token = None if dry_run else hub_token()
    finished = load_run(run)
    k = num_speculative_tokens or finished.report.get("k")  # else export's default (a DFlash draft's block)
    # without --out: a temporary folder, kept after a dry run (its path is what the dry run prints), removed
    # after an upload (at gpt-oss-120b's widths it holds gigabytes)
    temp = None if out else Path(tempfile.mkdtemp(prefix="eyas-publish-"))
    folder = Path(out) if out else temp / repo.split("/")[-1]
    # the kind's own layout first (DraftKind.formats): EAGLE-3's release layout, DFlash's z-lab layout
    fmt = kind_named(read_config(finished.checkpoint).kind).formats[0]
    result = export(finished.checkpoint, fmt, folder, num_speculative_tokens=k, engines=engines)
    k = result.num_speculative_tokens
    (folder / "README.md").write_text(render_model_card(finished, repo, result, k, license))
    shutil.copyfile(finished.root / "report.json", folder / "eyas_report.json")
    (folder / "recipe.yaml").write_text(finished.recipe_text)
    if dry_run:
        return Published(folder=folder, url=None)

    try:
        repo_url = upload(folder, repo, token, private, revision, finished.root.name)
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    url = str(repo_url) + (f"/tree/{revision}" if revision else "")
    return Published(folder=folder if temp is None else None, url=url)


def upload(folder: Path, repo: str, token: str, private: bool, revision: str | None, run_name: str):
    """`folder` to the hub repo `repo` (created if new; `revision`: a branch of it) -> the repo's url."""
    from huggingface_hub import HfApi, constants

    # HF_ENDPOINT: a hub mirror or a private hub (read here, not at import, so it can be set per call)
    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    api = HfApi(endpoint=endpoint, token=token)
    with hub_errors(repo, endpoint):
        repo_url = api.create_repo(repo, private=private, exist_ok=True, repo_type="model")
        if revision:
            api.create_branch(repo, branch=revision, exist_ok=True, repo_type="model")
        api.upload_folder(
            repo_id=repo,
            folder_path=str(folder),
            revision=revision,
            repo_type="model",
            commit_message=f"eyas publish {run_name}",
        )
    return repo_url


def transport_errors() -> tuple[type, ...]:
    """The HTTP client's errors (huggingface_hub 2 uses httpx2, earlier ones httpx)."""
    try:
        import httpx2 as client
    except ImportError:
        import httpx as client
    return (client.HTTPError,)


@contextmanager
def hub_errors(repo: str, endpoint: str):
    """The hub's refusals and failures as eyas errors: 401/403/404 are the token's rights or the repo id (bad
    input), anything else the hub or the network (a runtime failure: try again). The hub library's messages
    may quote the token; the one line eyas prints masks it (eyas/infra/errors.py)."""
    from huggingface_hub.errors import HfHubHTTPError

    try:
        yield
    except HfHubHTTPError as e:
        code = e.response.status_code if e.response is not None else None
        first = (str(e).splitlines() or [type(e).__name__])[0]
        if code in (401, 403, 404):
            raise InputError(
                f"--repo {repo}: the hub answered {first}; check the repo id and that the token may "
                "write there (`hf auth whoami`)"
            ) from e
        raise RunError(f"--repo {repo}: {endpoint} failed ({first}); re-run `eyas publish` later") from e
    except transport_errors() + (OSError, RuntimeError) as e:  # unreachable, reset, an upload that failed
        raise RunError(
            f"--repo {repo}: uploading to {endpoint} failed ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else 'no message'}); check the network (HF_ENDPOINT, "
            "proxies) and re-run `eyas publish`"
        ) from e


def main_publish(argv: list[str] | None = None) -> int:
    """`eyas publish RUN --repo ORG/NAME [--private] [--revision BRANCH] [--dry-run] [--out DIR]`."""
    parser = argparse.ArgumentParser(
        prog="eyas publish",
        description="Upload a run's EAGLE-3 draft to the "
        "Hugging Face Hub with a model card of its measured acceptance.",
    )
    parser.add_argument(
        "run", help="finished run directory (train/checkpoint-final, report.json, recipe.yaml)"
    )
    parser.add_argument("--repo", required=True, help="hub repo id ORG/NAME")
    parser.add_argument("--private", action="store_true", help="create the repo private")
    parser.add_argument("--revision", help="branch to upload to (created if missing)")
    parser.add_argument(
        "--dry-run", action="store_true", help="build the folder, upload nothing, print its path"
    )
    parser.add_argument("--out", help="folder to build (default: a new temporary directory)")
    parser.add_argument(
        "--license", default="apache-2.0", help="license in the model card (default apache-2.0)"
    )
    parser.add_argument(
        "--num-speculative-tokens", type=int, help="k in the serving commands (default: the report's k)"
    )
    parser.add_argument(
        "--engines", help="comma-separated engines to check and document (default vllm,sglang,trtllm)"
    )
    args = parser.parse_args(argv)
    engines = tuple(e.strip() for e in args.engines.split(",") if e.strip()) if args.engines else None
    try:
        published = publish(
            args.run,
            args.repo,
            private=args.private,
            revision=args.revision,
            dry_run=args.dry_run,
            out=args.out,
            license=args.license,
            num_speculative_tokens=args.num_speculative_tokens,
            engines=engines,
        )
    except (ValueError, OSError) as e:
        raise as_input(e) from e
    print(published.folder if args.dry_run else published.url)
    return 0
