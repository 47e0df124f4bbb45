"""`eyas serve`: an OpenAI-compatible HTTP server over the built-in speculative loop (FastAPI).

    eyas serve RUN_OR_RECIPE [--draft DIR] [--k K | --tree S,K,N] [--host 127.0.0.1] [--port 8000]

A run directory serves its target with its own trained draft (RUN/train/checkpoint-final) at the
recipe's eval.k; a recipe serves its target with `--draft` (or without speculation). The target is
loaded as every stage loads it, on the recipe's device(s).

Endpoints, with vLLM's request fields, response shapes and names (vLLM 0.10.2+):
    POST /v1/completions        prompt as text, token ids, or a list of either; `return_token_ids`
                                adds `token_ids` (generated) and `prompt_token_ids` to each choice
    POST /v1/chat/completions   messages rendered with the target's chat template
                                (chat_template_kwargs / reasoning_effort reach it); harmony targets
                                return the analysis channel as `reasoning_content`
    both: `stream` (server-sent events, `data: [DONE]`), `stream_options.include_usage`,
          temperature / top_p / top_k / seed / max_tokens / stop / stop_token_ids / ignore_eos,
          and `speculative: false` (eyas) to decode a request without the draft
    GET  /v1/models, /health, /metrics (vLLM's Prometheus names: serve/api/metrics.py)
A malformed request gets a 400 with vLLM's error body; the server keeps serving.

This file: the app (build_app wires the routers), the served model (build_served) and the command
line (main_serve). The endpoints: serve/api/completion/, serve/api/chat_completion/ (protocol.py:
bodies, serving.py: the endpoint), serve/api/basic.py; what they share: serve/api/serving.py,
serve/api/protocol.py.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError

from eyas.data.chat import eos_token_ids
from eyas.data.target import load_recipe_target, resolve_path
from eyas.infra.layout import run_checkpoint
from eyas.recipes.load import recipe_and_run
from eyas.recipes.schema import RecipeError
from eyas.recipes.types import TreeShape
from eyas.serve.api import basic
from eyas.serve.api.chat_completion import serving as chat_completion
from eyas.serve.api.completion import serving as completion
from eyas.serve.api.metrics import ServerMetrics
from eyas.serve.api.runner import EngineRunner
from eyas.serve.api.serving import Served, ServingError, invalid_request, serving_error
from eyas.serve.decoding.engine import Engine
from eyas.train.kinds import refuse_untrained

if TYPE_CHECKING:
    from eyas.recipes.schema import Recipe

__all__ = ["Served", "build_app", "build_served", "main_serve", "parse_args"]


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    app.state.served.runner.stop()


def build_app(served: Served) -> FastAPI:
    """The app over `served`: its routers, vLLM's error bodies, the engine thread stopped at shutdown."""
    app = FastAPI(title="eyas serve", docs_url=None, redoc_url=None, lifespan=_lifespan)
    app.state.served = served
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(ServingError, serving_error)
    for router in (basic.router, completion.router, chat_completion.router):
        app.include_router(router)
    return app


def build_served(
    recipe: Recipe,
    draft_dir: str | None,
    shape: TreeShape | None,
    name: str | None = None,
    max_num_seqs: int = 64,
    max_model_len: int | None = None,
    speculate: bool = True,
) -> Served:
    """Load the target (as every stage does) and the draft; start the engine thread."""
    from eyas.train.checkpoint import load_draft_beside, read_config  # lazy: safetensors

    if draft_dir is not None and speculate and shape.is_chain:  # before the target loads
        refuse_untrained(read_config(draft_dir), shape.steps, f"--draft {draft_dir}")
    model, tok = load_recipe_target(recipe.target)
    eos = set(eos_token_ids(model, tok))
    engines = {"plain": Engine(model, max_batch=max_num_seqs, eos_ids=eos, max_model_len=max_model_len)}
    draft = None
    if draft_dir is not None and speculate:
        draft = load_draft_beside(draft_dir, model)
        engines["spec"] = Engine(
            model, draft, shape, max_batch=max_num_seqs, eos_ids=eos, max_model_len=max_model_len
        )
    served_name = name or recipe.target.model
    metrics = ServerMetrics(served_name, shape.steps if draft is not None else 0)
    limit = engines["plain"].max_model_len
    return Served(
        name=served_name,
        root=resolve_path(recipe.target.model),
        tokenizer=tok,
        runner=EngineRunner(engines, metrics),
        metrics=metrics,
        max_model_len=limit,
        shape=shape if draft is not None else None,
        spec_default=draft is not None,
    )


# ---------------------------------------------------------------- the command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eyas serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("source", help="a run directory (its target and trained draft) or a recipe (its target)")
    p.add_argument("overrides", nargs="*", help="dotted recipe overrides, e.g. target.device=cuda:1")
    p.add_argument("--draft", help="an eyas draft checkpoint (default: RUN/train/checkpoint-final)")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--k", type=int, help="chain length (default: the recipe's eval.k)")
    shape.add_argument(
        "--tree", help="STEPS,TOPK,NUM_DRAFT_TOKENS: an EAGLE-2 dynamic tree (SGLang's parameters)"
    )
    p.add_argument("--no-speculation", action="store_true", help="serve the target alone")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--served-model-name", help="the model name clients use (default: the recipe's target.model)"
    )
    p.add_argument("--max-num-seqs", type=int, default=64, help="requests decoded at once (default 64)")
    p.add_argument("--max-model-len", type=int, help="context limit (default: the target's max positions)")
    p.add_argument("--log-level", default="info")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """`eyas serve` arguments; dotted overrides (key.sub=value) may come before or after the options."""
    p = _parser()
    args = p.parse_intermixed_args(argv)
    stray = [o for o in args.overrides if "=" not in o]
    if stray:
        p.error(f"unrecognized arguments: {' '.join(stray)}")
    return args


def _recipe_and_draft(args: argparse.Namespace) -> tuple[Recipe, str | None]:
    """The recipe (a run directory's recipe.yaml, or a recipe file or name) with the overrides, and the
    draft: --draft, else a run directory's draft (its best checkpoint, else its final one) if it has one."""

    recipe, run_dir = recipe_and_run(args.source, None, args.overrides)
    final = run_checkpoint(run_dir)
    return recipe, args.draft or (str(final) if Path(args.source).is_dir() and final.is_dir() else None)


def main_serve(argv: list[str]) -> int:
    """`eyas serve ...`: load, then serve until interrupted."""

    args = parse_args(argv)
    recipe, draft = _recipe_and_draft(args)
    if args.k is not None and args.k < 1:
        raise RecipeError("--k must be >= 1")
    try:
        tree = TreeShape.parse(args.tree) if args.tree else TreeShape.chain(args.k or recipe.eval.k)
    except ValueError as e:
        raise RecipeError(f"--tree {args.tree}: {e}") from None
    served = build_served(
        recipe,
        draft,
        tree,
        args.served_model_name,
        args.max_num_seqs,
        args.max_model_len,
        speculate=not args.no_speculation,
    )
    import uvicorn

    what = f"draft {draft}, {tree.label}" if served.shape else "no speculation"
    print(f"[eyas] serving {served.name} ({what}) on http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(build_app(served), host=args.host, port=args.port, log_level=args.log_level)
    return 0
