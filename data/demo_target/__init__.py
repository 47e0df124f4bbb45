"""The built-in demo target: a tiny gpt-oss-architecture model, trained on synthetic harmony
conversations and cached on first use (`eyas.data.demo_target.build.ensure_demo_target`).

corpus     the synthetic conversations and held-out prompts
tokenizer  byte-level BPE with harmony special tokens and chat template
model      the GptOssConfig of the demo architecture
training   the training loop
quality    well-formedness, correctness and entropy of greedy answers
build      building, caching and the `eyas demo-target` command
"""
