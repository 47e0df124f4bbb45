"""Sharded data stages: which slice of `regenerate` and `capture` this process does.

A stage's work list is fixed by the run (parts of prompts, batches of sequences), so a shard is
just a slice of it and every output keeps its global name; one index joins the slices, and the
joined result is the single-process result. The slice comes from, in this order:

- `--shard I/N` on `eyas regenerate|capture` (separate machines or processes over one run dir):
  a shard writes its own files and returns; the last one to finish joins them and marks the stage
  done. Each shard resumes on its own.
- `torchrun` / `accelerate launch` (RANK and WORLD_SIZE in the environment): as above, and every
  rank waits for the others, so `eyas run` goes on to the next stage together. On CUDA each rank
  places the target on its own group of the node's GPUs (`target_for_rank`).
- neither: shard 0 of 1, the whole stage.

`Slices` is what the two stages share: each slice records its work in its own file, leaves of a killed
process are removed, and the last slice to finish (a launched rank 0) joins the stage and writes DONE.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from eyas.infra.io import read_json
from eyas.infra.layout import is_done, read_done
from eyas.recipes.schema import RecipeError, TargetSection

POLL_S = 2.0


@dataclass(frozen=True)
class Shard:
    index: int = 0  # this process's slice, 0-based
    count: int = 1  # slices in all
    launched: bool = False  # started by torchrun / accelerate launch: ranks wait for each other

    @property
    def label(self) -> str:
        """File-name tag of this slice: "r0of2" (unused for a single shard)."""
        return f"r{self.index}of{self.count}"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def round_robin(self, num_items: int) -> list[int]:
        """This shard's items of 0..num_items-1 dealt out in turn (for items of about equal cost)."""
        return list(range(self.index, num_items, self.count))

    def contiguous(self, costs: list[int]) -> tuple[int, int]:
        """This shard's (start, end) of the items in order: about 1/count of their cost (balanced_ranges)."""
        return balanced_ranges(costs, self.count)[self.index]


def parse_shard(text: str) -> Shard:
    """ "I/N" (0 <= I < N) -> Shard."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise RecipeError(f"--shard {text!r}: expected I/N, e.g. 0/4 for the first of 4 shards") from None
    if not (n >= 1 and 0 <= i < n):
        raise RecipeError(f"--shard {text}: need 0 <= I < N")
    return Shard(i, n)


def current_shard(explicit: str | Shard | None = None) -> Shard:
    """The explicit `--shard`, else the launcher's RANK/WORLD_SIZE, else the whole stage."""
    if isinstance(explicit, Shard):
        return explicit
    if explicit:
        return parse_shard(explicit)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        return Shard(int(os.environ["RANK"]), world, launched=True)
    return Shard()


def balanced_ranges(costs: list[int], count: int) -> list[tuple[int, int]]:
    """Split items 0..len(costs) into `count` contiguous ranges of about equal total cost.

    -> [(start, end)] per shard; range i ends at the first item where the running cost reaches
    i+1 shares (so shards keep the items' order and their concatenation is the whole list)."""
    total, run, bounds = sum(costs), 0, [0]
    for j, c in enumerate(costs):
        run += c
        while len(bounds) < count and run * count >= total * len(bounds):
            bounds.append(j + 1)
    bounds += [len(costs)] * (count + 1 - len(bounds))
    return list(zip(bounds[:-1], bounds[1:]))


def wait_until(ready, what: str, poll_s: float = POLL_S) -> None:
    """Poll `ready()` until true, saying once what is awaited (another rank's files)."""
    if ready():
        return
    print(f"[eyas] waiting for {what}", flush=True)
    while not ready():
        time.sleep(poll_s)


def rank_gpus(local_rank: int, local_world: int, num_gpus: int) -> list[int]:
    """The node's GPUs of one launched rank: `num_gpus // local_world` consecutive ones."""
    if num_gpus < local_world:
        raise RecipeError(
            f"{local_world} processes per node but {num_gpus} visible GPUs: start at most one "
            "process per GPU (or one per group of GPUs that holds the target)"
        )
    per = num_gpus // local_world
    return list(range(local_rank * per, (local_rank + 1) * per))


def target_for_rank(t: TargetSection, shard: Shard) -> TargetSection:
    """The recipe's `target` section for this rank: launched ranks on CUDA each get their own GPUs.

    device auto/cuda -> the first GPU of the rank's group; a planned device_map (auto, balanced…) ->
    max_memory limited to the group (the recipe's own limits for those GPUs, else their free memory);
    an explicit device_map cannot be split and is refused. Other cases: `t` unchanged."""
    import torch

    if not shard.launched or not torch.cuda.is_available():
        return t
    gpus = rank_gpus(
        int(os.environ.get("LOCAL_RANK", shard.index)),
        int(os.environ.get("LOCAL_WORLD_SIZE", shard.count)),
        torch.cuda.device_count(),
    )
    if t.device_map is None:
        return t.model_copy(update={"device": f"cuda:{gpus[0]}"}) if t.device in ("auto", "cuda") else t
    if isinstance(t.device_map, dict):
        raise RecipeError(
            "target.device_map: an explicit map cannot be split between launched ranks; start "
            "one `eyas regenerate|capture --shard I/N` per group of GPUs "
            "(CUDA_VISIBLE_DEVICES) instead"
        )
    own = {d: v for d, v in (t.max_memory or {}).items() if d in ("cpu", "disk")}
    for g in gpus:
        given = (t.max_memory or {}).get(str(g), (t.max_memory or {}).get(f"cuda:{g}"))
        own[str(g)] = given or f"{torch.cuda.mem_get_info(g)[0] // 2**20}MiB"
    return t.model_copy(update={"max_memory": own})


@dataclass(frozen=True)
class Slices:
    """One sharded stage in a run dir, seen from this process's `shard` of it.

    Every slice writes its outputs under their global names, and its record `<stage>/<prefix>-rIofN.json`
    (`record`); `complete(record)` says whether the slice is finished. A single shard (count 1) writes
    no record and joins at once."""

    run_dir: Path
    stage: str
    shard: Shard
    prefix: str  # of the slices' record files: "index" -> index-r0of2.json
    complete: Callable[[dict], bool]

    @property
    def out_dir(self) -> Path:
        return Path(self.run_dir) / self.stage

    def record(self, index: int | None = None) -> Path:
        """The record file of slice `index` (this process's by default)."""
        i = self.shard.index if index is None else index
        return self.out_dir / f"{self.prefix}-{Shard(i, self.shard.count).label}.json"

    def records(self) -> list[dict]:
        """Every slice's record, in slice order."""
        return [read_json(self.record(i)) for i in range(self.shard.count)]

    def on_disk(self) -> list[Path]:
        """The record files of every slicing there is in the stage's folder (of any slice count)."""
        return sorted(self.out_dir.glob(f"{self.prefix}-r*of*.json"))

    def unfinished(self) -> list[int]:
        """The slices whose record is missing or not complete."""
        return [
            i
            for i in range(self.shard.count)
            if not (self.record(i).is_file() and self.complete(read_json(self.record(i))))
        ]

    def remove_strays(self, patterns: list[str], keep: Collection[str] = ()) -> None:
        """Delete the files of the stage's folder that match `patterns` (this process's own: others may be
        writing theirs) and are not named in `keep`: left by a killed process."""
        for stray in [f for pattern in patterns for f in self.out_dir.glob(pattern) if f.name not in keep]:
            stray.unlink()

    def finish(self, join: Callable[[], dict], done_here: dict) -> dict:
        """After this slice's own work: the stage's record if this process joins the stage or finds it
        joined (`join()` writes the joined outputs and DONE), else {"shard", "complete": False, **done_here}.

        A launched rank 0 waits for every slice and joins, other launched ranks wait for its DONE; a
        --shard process joins when every slice is finished (the last one to finish), else it leaves."""
        shard, stage, run_dir = self.shard, self.stage, self.run_dir
        if shard.count == 1:
            return join()
        if shard.launched:
            if shard.index == 0:
                wait_until(lambda: not self.unfinished(), f"the other ranks' {stage} slices")
            else:
                wait_until(lambda: is_done(run_dir, stage), f"rank 0 to join the {stage} slices")
        elif missing := self.unfinished():
            print(
                f"{stage}: shard {shard} done; slices {missing} are not finished yet: the last to finish "
                "joins them"
            )
            return {"shard": str(shard), "complete": False, **done_here}
        if is_done(run_dir, stage):
            return read_done(run_dir, stage)
        return join()

    def wait_or_leave(self, what: str) -> dict:
        """For a slice with nothing to do: a launched rank waits for the stage's DONE (-> its record); a
        --shard process leaves at once."""
        if self.shard.launched:
            wait_until(lambda: is_done(self.run_dir, self.stage), what)
            return read_done(self.run_dir, self.stage)
        print(f"{self.stage}: shard {self.shard}: nothing to do ({what})")
        return {"shard": str(self.shard), "complete": False}
