"""Prompt-length buckets for τ by prompt length: <1K, 1-2K, 2-4K, ... tokens (K = 1,024), doubling."""

from __future__ import annotations

from collections.abc import Iterable


def length_bucket(tokens: int) -> str:
    """A prompt's length bucket from its token count."""
    if tokens < 1024:
        return "<1K"
    lo = 1 << (tokens.bit_length() - 1)
    return f"{lo // 1024}-{2 * lo // 1024}K"


def bucket_order(labels: Iterable[str]) -> list[str]:
    """Distinct length_bucket labels, shortest first."""
    return sorted(set(labels), key=lambda b: 0 if b == "<1K" else int(b.split("-")[0]))
