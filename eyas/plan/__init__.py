"""`eyas plan`: what a recipe will cost on a set of GPUs, before anything runs.

cost.py     the assumptions, the exact parameter counts, and the cost model: memory, storage, time
tokens.py   the target's tokenizer, and the turns and prompt lengths of a run's prompts stage
report.py   the text the command prints
command.py  `main_plan` (the command's arguments) and `plan` (the figures, tying the above together)
"""
