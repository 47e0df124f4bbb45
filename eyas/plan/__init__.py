"""`eyas plan`: what a recipe will cost on a set of GPUs, before anything runs.

cost.py     the assumptions, the exact parameter counts, and the cost model: memory, storage, time
capture_memory.py, eval_memory.py, stage_memory.py
            what capture and eval hold, and every stage's memory of eyas's own process
flops.py, train_work.py
            capture's forward and training's rows in FLOPs
tokens.py   the target's tokenizer, and the turns and prompt lengths of a run's prompts stage
report.py   the text the command prints
command.py  `main_plan` (the command's arguments) and `plan` (the figures, tying the above together)
"""
