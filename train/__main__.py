"""`accelerate launch -m eyas.train RECIPE [--out DIR] [key.sub=value ...]`: the train stage alone,
on as many processes as accelerate (or torchrun) starts (DDP, FSDP or DeepSpeed per the accelerate
config); each process trains on its share of every global batch (train/schedule.py)."""

import argparse
import sys

from eyas.data.sharding import current_shard
from eyas.infra.errors import debugging, report_failures
from eyas.pipeline import check_target, done_already, prepare_run, run_stage
from eyas.recipes.load import recipe_and_run
from eyas.train.distributed import process_state


def main(argv=None) -> int:
    """Failures and interrupts are reported as `eyas` reports them (eyas/infra/errors.py)."""
    debug, argv = debugging(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="eyas.train", description=__doc__)
    p.add_argument("recipe")
    p.add_argument("--out")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_intermixed_args(argv)

    def train() -> int:
        recipe, run_dir = recipe_and_run(args.recipe, args.out, args.overrides)
        check_target(recipe)
        state = process_state()  # one per process; run_train's Accelerator shares it
        if state.is_main_process:
            prepare_run(recipe, run_dir)
        state.wait_for_everyone()
        if not done_already(run_dir, "train"):  # every rank trains; rank 0 records its cost
            run_stage(recipe, run_dir, "train", current_shard(), not args.no_progress)
        return 0

    return report_failures(train, debug)


if __name__ == "__main__":
    sys.exit(main())
