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
            raise ValueError(
                "a DeepSpeed accelerate config with ACCELERATE_USE_CPU=true: accelerate ignores "
                "DeepSpeed on `cpu` processes; unset ACCELERATE_USE_CPU (eyas runs DeepSpeed over gloo)"
            )
        return {"cpu": False, "backend": "gloo"}
    return {"cpu": True}


def process_state():
    """This process's accelerate PartialState (the process group), set up for the launcher's choice."""
    from accelerate import PartialState
    from accelerate.utils import DistributedType

    kwargs = state_kwargs()
    state = PartialState(**kwargs)
    if (
        not torch.cuda.is_available()
        and launcher_kind() == "fsdp"
        and state.distributed_type == DistributedType.MULTI_CPU
    ):
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
        out["deepspeed_plugin"] = DeepSpeedPlugin(
            gradient_accumulation_steps=grad_accum, gradient_clipping=float(grad_clip)
        )
    return out


def configure_fsdp2(acc, draft) -> None:
    """Before `prepare` under FSDP2: compute in bf16 where training is bf16, but reduce gradients in fp32
    and leave the module's inputs and outputs alone (the teacher's probabilities and the loss stay fp32,
    as under DDP); the frozen embedding (the target's, 201088 x 2880 for gpt-oss) is not sharded: it
    never changes, and gathering it every forward would cost more than keeping a copy."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    plugin = acc.state.fsdp_plugin
    plugin.mixed_precision_policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if acc.mixed_precision == "bf16" else None,
        reduce_dtype=torch.float32,
        output_dtype=None,
        cast_forward_inputs=False,
    )
    draft.embed_tokens.to(acc.device)  # FSDP2 places only the parameters it manages
    plugin.ignored_modules = [draft.embed_tokens]


def check_deepspeed(acc, grad_accum: int) -> None:
    """At start-up under DeepSpeed: ZeRO-3 must be able to gather the final weights, and the accumulation
    DeepSpeed runs must be the recipe's (a user `deepspeed_config_file` may set its own)."""
    plugin = acc.state.deepspeed_plugin
    if plugin is None:
        return
    if plugin.zero_stage == 3 and not plugin.zero3_save_16bit_model:
        raise ValueError(
            "DeepSpeed ZeRO-3 without zero3_save_16bit_model: true in the accelerate config; the "
            "final weights could not be gathered (recipes/accelerate/zero3.yaml sets it)"
        )
    ds_accum = plugin.deepspeed_config.get("gradient_accumulation_steps")
    if ds_accum not in (None, "auto", grad_accum):
        raise ValueError(
            f"the DeepSpeed config sets gradient_accumulation_steps={ds_accum}, the recipe "
            f"train.grad_accum={grad_accum}: remove it from the DeepSpeed config (eyas sets it)"
        )


def full_state_dict(acc, module) -> dict:
    """The full weights on the main process (every process must call: it is a collective). Under DeepSpeed
    the trainable ones are its fp32 master copies (with bf16 the module itself holds bf16 copies)."""
    from accelerate.utils import DistributedType

    state = acc.get_state_dict(module)
    if acc.distributed_type == DistributedType.DEEPSPEED:
        from deepspeed.utils import safe_get_full_fp32_param

        for name, p in acc.unwrap_model(module).named_parameters():
            if p.requires_grad:
                full = safe_get_full_fp32_param(p)  # gathered under ZeRO-3
                if acc.is_main_process:
                    state[name] = full.detach().float().cpu()
    return state
