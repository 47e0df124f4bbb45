"""The serving loop's defaults and sizes that the recipe schema, `eyas plan` and the loop share, here alone: a
leaf module (no imports), so that the schema reads its defaults without loading torch.

    PREFILL_TOKENS        tokens per target forward while prompts are prefilled (eval.prefill_tokens)
    ATTENTION_BLOCK_MB    MiB of attention scores per block of query rows (eval.attention_block_mb)
    DECODE_RESERVE        tokens of each request's answer the caches are reserved for when it joins
    spare_slots           cache slots a round's speculative entries may take past the context
"""

PREFILL_TOKENS = 8192
ATTENTION_BLOCK_MB = 1024
# a joining request's caches hold its prompt and this much of its answer (its max_tokens where less); later
# rounds grow them by doubling, up to the context (`eyas serve` gives max_tokens the whole context)
DECODE_RESERVE = 2048


def spare_slots(num_draft_tokens: int, steps: int, topk: int) -> int:
    """Slots past the context a round may write: the verification's nodes and the draft's tree levels."""
    return 2 * num_draft_tokens + steps * topk
