"""How eyas sets up accelerate for one process, DDP, FSDP2 and DeepSpeed ZeRO-2/3, on GPUs and on
CPU processes (gloo: how the tests run them).

`accelerate launch --config_file recipes/accelerate/{ddp,fsdp2,zero2,zero3}.yaml` passes its
choice through the environment (ACCELERATE_USE_FSDP, ACCELERATE_USE_DEEPSPEED, ...); plain
`torchrun` gives DDP. On machines without CUDA accelerate would quietly run an FSDP or DeepSpeed
config as DDP (MULTI_CPU) or on one process; eyas instead runs what the config asks for:

* DDP: `cpu=True` (accelerate's MULTI_CPU: gloo DDP);
* FSDP2: the gloo process group is handed to accelerate's FSDP path (its `fully_shard`, sharded
  state saves and full-weight gathering, exactly as on GPUs);
* DeepSpeed: not `cpu` (accelerate only enables DeepSpeed then), with a gloo process group.

DeepSpeed's gradient accumulation and clipping come from the recipe (train.grad_accum,
train.grad_clip), so the global batch and the clipping are the recipe's under every launcher.
"""

from __future__ import annotations

import os
import warnings

import torch


def _flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() == "true"


def launcher_kind() -> str:
    """What the launcher asked for: 'deepspeed', 'fsdp' or 'ddp' (also one process)."""
    if _flag("ACCELERATE_USE_DEEPSPEED"):
        return "deepspeed"
    if _flag("ACCELERATE_USE_FSDP"):
        return "fsdp"
    return "ddp"


def state_kwargs() -> dict:
    """Keyword arguments for accelerate's PartialState / Accelerator process setup."""
    if torch.cuda.is_available():
        return {"cpu": False}
    if launcher_kind() == "deepspeed":
        if _flag("ACCELERATE_USE_CPU"):
            raise ValueError("a DeepSpeed accelerate config with ACCELERATE_USE_CPU=true: accelerate ignores "
                             "DeepSpeed on `cpu` processes; unset ACCELERATE_USE_CPU (eyas runs DeepSpeed over gloo)")
        return {"cpu": False, "backend": "gloo"}
    return {"cpu": True}


def process_state():
    """This process's accelerate PartialState (the process group), set up for the launcher's choice."""
    from accelerate import PartialState
    from accelerate.utils import DistributedType

    kwargs = state_kwargs()
    state = PartialState(**kwargs)
    if (not torch.cuda.is_available() and launcher_kind() == "fsdp"
            and state.distributed_type == DistributedType.MULTI_CPU):
        # accelerate turns a MULTI_GPU state into FSDP when ACCELERATE_USE_FSDP is set; on CPU it leaves
        # MULTI_CPU (DDP). The gloo group serves FSDP2 as well: hand it over.
        PartialState._shared_state["distributed_type"] = DistributedType.MULTI_GPU
    if launcher_kind() == "fsdp":
        # the draft layer returns its keys and values (views) for the later TTT steps; nothing changes
        # them in place, which is what FSDP2 warns about on every call
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    return state


def accelerator_kwargs(grad_accum: int, grad_clip: float) -> dict:
    """Keyword arguments for `Accelerator`, after `process_state()` has run in this process."""
    from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs

    kwargs = state_kwargs()
    out: dict = {"cpu": kwargs["cpu"], "gradient_accumulation_steps": grad_accum, "kwargs_handlers": []}
    if "backend" in kwargs:
        out["kwargs_handlers"].append(InitProcessGroupKwargs(backend=kwargs["backend"]))
    if launcher_kind() == "deepspeed":
        # the rest (ZeRO stage, offload, 16-bit gathering) from the accelerate config
        out["deepspeed_plugin"] = DeepSpeedPlugin(gradient_accumulation_steps=grad_accum,
                                                  gradient_clipping=float(grad_clip))
    return out
