"""Compact capture storage: aux states in fewer bits, and the teacher as top-k log-probabilities
instead of the final hidden state.

Per token today (`aux_format: same`, `teacher: final`, bf16) a capture stores n_aux*H + H values of
2 bytes: 23,040 bytes at gpt-oss-120b size (3 aux + final, H = 2880). The compact forms:

aux_format (the aux states, (N, n_aux*H) per shard):
    same  the capture dtype (`capture.dtype`), as before
    fp8   float8 e4m3 values, one fp32 scale per token and aux state (its max |x| / 448):
          n_aux*H + 4*n_aux bytes (8,652 at gpt-oss-120b size)
    int6  blocks of 32 values along the hidden size, each scaled by its max |x| / 31 (a bf16 scale)
          and rounded to -31..31, four values in three bytes: 3*n_aux*H/4 + n_aux*H/16 bytes (7,020)
    int4  the same with max |x| / 7 and -7..7, two values per byte: n_aux*H/2 + n_aux*H/16 bytes (4,860)
teacher (what the training target comes from):
    final the target's final (post-norm) state, H values in the capture dtype (5,760 in bf16);
          training applies the target's lm_head to it
    topk  the target's k most likely next tokens over its whole vocabulary (int32 ids, top-1
          first) and their log-probabilities (fp16): 6k bytes (192 at k = 32); training
          restricts them to the draft vocabulary and renormalises

Quantisation is deterministic (round to nearest), so a capture resumed mid-way writes the same bytes.
"""

from __future__ import annotations

import torch

AUX_FORMATS = ("same", "fp8", "int6", "int4")
TEACHERS = ("final", "topk")
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
BLOCK = 32  # int6 / int4 values per scale
LEVELS = {"int6": 31, "int4": 7}  # largest |q|: values are rounded to -q..q


def bytes_per_token(
    n_aux: int, hidden: int, aux_format: str, teacher: str, topk: int, dtype_bytes: int
) -> int:
    """Stored bytes per token for these choices, the token id (4) and loss mask (1) included."""
    n = n_aux * hidden
    aux = {
        "same": n * dtype_bytes,
        "fp8": n + 4 * n_aux,
        "int6": 3 * n // 4 + 2 * (n // BLOCK),
        "int4": n // 2 + 2 * (n // BLOCK),
    }[aux_format]
    return aux + (hidden * dtype_bytes if teacher == "final" else 6 * topk) + 5


def check_block_width(fmt: str, width: int) -> None:
    if fmt in LEVELS and width % BLOCK:
        raise ValueError(
            f"capture.aux_format={fmt} needs a hidden size that is a multiple of {BLOCK}, got {width}"
        )


def encode_aux(aux: torch.Tensor, n_aux: int, fmt: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """aux (N, n_aux*H) -> the shard tensors {"aux", and "aux_scale" for fp8 / int4}."""
    if fmt == "same":
        return {"aux": aux.to(dtype)}
    N, D = aux.shape
    x = aux.float()
    if fmt == "fp8":
        x = x.view(N, n_aux, D // n_aux)
        scale = (x.abs().amax(-1) / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)  # (N, n_aux)
        q = (x / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        return {"aux": q.view(N, D), "aux_scale": scale}
    if fmt in LEVELS:
        check_block_width(fmt, D // n_aux)
        top = LEVELS[fmt]
        x = x.view(N, D // BLOCK, BLOCK)
        scale = (x.abs().amax(-1) / top).to(torch.bfloat16)  # (N, D/32), rounded first: decode uses it
        s = scale.float().clamp(min=torch.finfo(torch.float32).tiny)
        q = (
            (torch.round(x / s[..., None]).clamp(-top, top) + top + 1).to(torch.int32).view(N, D)
        )  # 1..2*top+1
        if fmt == "int4":  # (N, D/2): even values in the low nibble, odd in the high
            packed = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)
        else:  # (N, 3D/4): values 4i..4i+3 as 24 bits, little-endian
            w = q[:, 0::4] | (q[:, 1::4] << 6) | (q[:, 2::4] << 12) | (q[:, 3::4] << 18)  # (N, D/4)
            packed = (
                torch.stack([w & 0xFF, (w >> 8) & 0xFF, w >> 16], dim=-1).view(N, 3 * D // 4).to(torch.uint8)
            )
        return {"aux": packed, "aux_scale": scale}
    raise ValueError(f"unknown aux format {fmt!r}; one of {AUX_FORMATS}")


def decode_aux(t: dict[str, torch.Tensor], n_aux: int, fmt: str, dtype: torch.dtype) -> torch.Tensor:
    """The shard tensors of some rows -> aux (N, n_aux*H) in `dtype`."""
    q = t["aux"]
    if fmt == "same":
        return q.to(dtype)
    if fmt == "fp8":
        N, D = q.shape
        x = q.view(N, n_aux, D // n_aux).float() * t["aux_scale"].float()[..., None]
        return x.view(N, D).to(dtype)
    if fmt in LEVELS:
        N, top = q.shape[0], LEVELS[fmt]
        if fmt == "int4":
            v = torch.stack([q & 0xF, q >> 4], dim=-1).view(N, -1)  # (N, D)
        else:
            b = q.view(N, -1, 3).to(torch.int32)
            w = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)  # (N, D/4)
            v = torch.stack([w & 63, (w >> 6) & 63, (w >> 12) & 63, w >> 18], dim=-1).view(N, -1)  # (N, D)
        x = (v.float() - (top + 1)).view(N, -1, BLOCK) * t["aux_scale"].float()[..., None]  # -top..top
        return x.view(N, -1).to(dtype)
    raise ValueError(f"unknown aux format {fmt!r}; one of {AUX_FORMATS}")


@torch.no_grad()
def topk_teacher(
    final: torch.Tensor, lm_head_weight: torch.Tensor, k: int, chunk: int = 1024
) -> dict[str, torch.Tensor]:
    """final (N, H) post-norm target states, lm_head_weight (V, H) -> {"teacher_ids" (N, k) int32,
    top-1 first; "teacher_logprobs" (N, k) fp16, log-softmax over the whole vocabulary}."""
    ids, lps = [], []
    w = lm_head_weight.float()  # fp32 logits, as the final-state teacher's (train/ttt.target_view)
    for s in range(0, final.shape[0], chunk):  # full-vocab logits in chunks: V is 201088 for gpt-oss
        z = final[s : s + chunk].to(device=w.device, dtype=torch.float32) @ w.T  # (c, V)
        top = torch.log_softmax(z, dim=-1).topk(k, dim=-1)  # sorted, largest first
        ids.append(top.indices.to(torch.int32).cpu())
        lps.append(top.values.to(torch.float16).cpu())
    return {"teacher_ids": torch.cat(ids), "teacher_logprobs": torch.cat(lps)}
