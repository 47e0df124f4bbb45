"""The bottom layer: what every stage folder uses and which imports nothing of theirs (docs/architecture.md,
"Layers"): errors and interrupts, atomic writes (io), a run's layout and its stage table, checksums, the
cache, peak memory, and running vLLM (vllm/)."""
