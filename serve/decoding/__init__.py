"""eyas.serve.decoding: the built-in speculative serving loop.

engine.py     continuous batching: requests join and leave, one target forward verifies every row
tree.py       chain / EAGLE-2 dynamic tree shapes (SGLang's steps, topk, num_draft_tokens)
sampling.py   vLLM's temperature / top-k / top-p, and lossless tree verification
cache.py      per-row KV cache with exact per-row rollback (no transformers Cache semantics)
masks.py      ragged, tree and sliding-window attention masks
reference.py  the target's plain greedy output (Hugging Face generate), the lossless reference
"""
