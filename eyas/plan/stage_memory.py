"""Each stage's memory of eyas's own process, as `eyas plan` prints it and benchmarks/bench_full_width.py sets
it beside what a run measured: process_memory (cost.py) for the target and training, capture_memory.py for an
hf capture, eval_memory.py for eval's loop. On a CPU (`--gpus cpu`) the host's memory is the process's: the
target in the dtype this host computes in, the shard capture fills, and the interpreter's own floor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from eyas.plan.capture_memory import CaptureMemory, capture_memory
from eyas.plan.cost import (
    Assumptions,
    DraftCount,
    capture_bytes_per_token,
    element_bytes,
    process_memory,
    shard_buffer_bytes,
)
from eyas.plan.eval_memory import EvalMemory, eval_memory

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from eyas.data.target import TargetCount
    from eyas.recipes.schema import Recipe


@dataclass
class StageMemory:
    process: dict[str, float]  # bytes per stage (0: vLLM holds the target, not eyas's process)
    capture: CaptureMemory | None  # an hf capture's parts
    eval: EvalMemory  # eval's loop's parts
    element: int  # bytes a target parameter in the dtype the target computes in (element_bytes)


def stage_memory(
    recipe: Recipe,
    cfg: PretrainedConfig,
    target: TargetCount,
    draft: DraftCount,
    a: Assumptions,
    cpu: bool,
    tokens: float,
    longest: float,
) -> StageMemory:
    """The planned memory of every stage (module docstring) for `tokens` captured, `longest` the longest
    sequence's; transformers holds the target dequantized (its MXFP4 kernels fetch from the hub: not on an
    offline cluster) unless target.weights says mxfp4; eval's loop in eval.target_dtype."""
    per_param = element_bytes(recipe.target.dtype, cpu)
    held = target.bytes_mxfp4 if recipe.target.weights == "mxfp4" else target.params * per_param
    eval_bytes = element_bytes(recipe.eval.target_dtype or recipe.target.dtype, cpu)
    memory = process_memory(recipe, cfg, draft, a, held, target.params * eval_bytes, eval_bytes, cpu)
    n_aux, cap = len(draft.config.aux_layer_ids), None
    if memory["capture"]:
        bpt = capture_bytes_per_token(recipe, cfg, n_aux)
        shard = shard_buffer_bytes(recipe, bpt, tokens) if cpu else 0.0  # on a CPU, the process's
        cap = capture_memory(recipe, cfg, n_aux, held, per_param, longest, bpt, shard)
        memory["capture"] = cap.total
    ev = eval_memory(recipe, cfg, draft.config, memory["eval"], eval_bytes)
    memory["eval"] = ev.total
    if cpu:  # the process's own floor (Assumptions.cpu_process_bytes) where the stage runs in it
        memory = {k: v + a.cpu_process_bytes if v else v for k, v in memory.items()}
    return StageMemory(memory, cap, ev, per_param)
