"""`accelerate launch -m eyas.train RECIPE [--out DIR] [key.sub=value ...]`: the train stage alone,
on as many processes as accelerate (or torchrun) starts (DDP, FSDP or DeepSpeed per the accelerate
config); each process trains on its share of every global batch (train/schedule.py)."""

import argparse
import sys

from eyas.pipeline import check_target, prepare_run, recipe_and_run
from eyas.recipes.schema import RecipeError
from eyas.train.distributed import process_state
from eyas.train.trainer import run_train


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="eyas.train", description=__doc__)
    p.add_argument("recipe")
    p.add_argument("--out")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_intermixed_args(argv)
    try:
        recipe, run_dir = recipe_and_run(args.recipe, args.out, args.overrides)
        check_target(recipe)
        state = process_state()  # one per process; run_train's Accelerator shares it
        if state.is_main_process:
            prepare_run(recipe, run_dir)
        state.wait_for_everyone()
        run_train(recipe, run_dir, progress=not args.no_progress)
    except RecipeError as e:
        print(f"eyas.train: recipe error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
