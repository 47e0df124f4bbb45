"""The stage table: order, the recipe sections each stage depends on, which stages share their work out,
and where each stage's and each command's function lives. A leaf: it imports nothing of eyas's, so any
module can read the table, and the functions are imported by name only when a stage or command runs.

    prompts -> regenerate -> capture -> vocab -> train -> eval
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

STAGE_ORDER = ("prompts", "regenerate", "capture", "vocab", "train", "eval")

# the recipe sections each stage's output depends on (a finished stage refuses a recipe that changed them)
STAGE_KEYS = {
    "prompts": ("data",),
    "regenerate": ("target", "data"),
    "capture": ("target", "capture"),
    "vocab": ("vocab",),
    "train": ("draft", "train"),
    "eval": ("eval",),
}

# stages that share their work out between processes or machines (data/sharding.py); train does its own
SHARDED = ("regenerate", "capture")

# stage -> "module:function", called as fn(recipe, run_dir, progress=..., [shard=...])
STAGE_FUNCTIONS = {
    "prompts": "eyas.data.prompts:run_prompts",
    "regenerate": "eyas.data.regenerate:run_regenerate",
    "capture": "eyas.data.capture:run_capture",
    "vocab": "eyas.data.vocab:run_vocab",
    "train": "eyas.train.trainer:run_train",
    "eval": "eyas.eval.evaluate:run_eval",
}

# `eyas <command>` with a parser of its own -> "module:function", called as fn(argv) -> exit status
COMMANDS = {
    "export": "eyas.serve.interchange.export:main_export",
    "import": "eyas.serve.interchange.importer:main_import",
    "publish": "eyas.publish:main_publish",
    "demo-target": "eyas.data.demo_target.build:main_demo_target",
    "full-width-target": "eyas.data.demo_target.full_width:main_full_width_target",
    "serve": "eyas.serve.api.server:main_serve",
    "plan": "eyas.plan.command:main_plan",
    "verify": "eyas.infra.integrity:main_verify",
    "recipe-keys": "eyas.recipes.keys:main_recipe_keys",
    "install-vllm": "eyas.infra.vllm.vllm_env:main_install_vllm",
}


def resolve(spec: str) -> Callable:
    """ "package.module:function" -> the function (its module imported now)."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def stage_fn(stage: str) -> Callable:
    """The function that runs `stage`."""
    if stage not in STAGE_FUNCTIONS:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGE_ORDER)}")
    return resolve(STAGE_FUNCTIONS[stage])
