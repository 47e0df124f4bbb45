"""The EAGLE-3 draft head, top to bottom.

    aux states of the target  (B, T, n_aux * H_t)  -- vLLM ids: id k = input of decoder layer k
            │ [norm_before_fc: input_norm, one RMSNorm over all n_aux * H_t]
            │ fc (no bias)
            ▼
    g  (B, T, H) ───────────────────────────────┐ residual stream carries h
    embed(token) (B, T, H)                      │ (norm_before_residual: hidden_norm(h))
      input_layernorm(embed) ‖ hidden_norm(h)   │  (B, T, 2H)
            │ self_attn (q/k/v take 2H, GQA, RoPE)
            ▼                                   │
            + ◄─────────────────────────────────┘
            │ post_attention_layernorm → SwiGLU MLP, + residual
            ▼
    [num_layers > 1: plain pre-norm Llama layers `layers.1..`, q/k/v take H, own KV per layer]
            ▼
    h_out (B, T, H)    "prenorm": fed back as the next step's h (norm_output: norm(h_out) is)
            │ norm → lm_head
            ▼
    logits over the draft vocab (B, T, V_d);  target id = draft id + d2t[draft id]

Parameter names are those of the EAGLE-3 release layout (`fc`, `midlayer.*`, `norm`,
`lm_head`, `d2t`, `t2d`, `embed_tokens`), which vLLM's `LlamaForCausalLMEagle3` loads, plus the
options' own as vLLM's llama_eagle3.py names them (`input_norm`, `layers.1.*`, ...).
The token embedding is the target's and stays frozen.

The options, each as vLLM's llama_eagle3.py runs it (serve/interchange/engines.py says which engine
versions load which):
  norm_before_fc        one RMSNorm `input_norm` (weight n_aux * H_t, eps rms_norm_eps) over the
                        concatenated aux states before fc (vLLM PR #36545; speculators `input_norm`);
  norm_before_residual  the first layer's residual is hidden_norm(h) instead of h (vLLM `LlamaDecoderLayer`
                        of llama_eagle3.py; the speculators format's default when the key is absent);
  num_layers            decoder layers: the first as above, then plain Llama layers over H (vLLM PR #26164);
                        the next step's h is the last layer's prenorm output;
  norm_output           the next step's h is the final norm's output instead of the prenorm one (vLLM
                        llama_eagle3.py `aux_output`; speculators' default since 0.9, "EAGLE 3.1").

Two ways to run attention share every weight:
  * `step()` — inference: new tokens attend to a KV cache plus themselves, causally.
  * `train/ttt.py` — training-time test: all positions of all unrolled steps at once, with the
    attention pattern of `train/attention.py`.
The test `tests/test_train_serve_consistency.py` holds them equal.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .blocked_attention import attend_in_blocks
from .kinds.config import DraftConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Rotary(nn.Module):
    """cos/sin for absolute positions, from transformers' own rope functions (default, yarn, llama3…)."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        lcfg = LlamaConfig(
            hidden_size=cfg.hidden_size,
            num_attention_heads=cfg.num_attention_heads,
            head_dim=cfg.head_dim,
            max_position_embeddings=cfg.max_position_embeddings,
            rope_parameters=dict(cfg.rope_parameters),
        )
        rope_type = lcfg.rope_parameters.get("rope_type", "default")
        with torch.device("cpu"):  # real frequencies even when the draft is built on the meta device
            inv_freq, scaling = self._frequencies(cfg, lcfg, rope_type, ROPE_INIT_FUNCTIONS)
        # a plain attribute, not a buffer: `.to(bfloat16)` on the draft must not round the frequencies
        self.inv_freq = inv_freq.float()
        self.attention_scaling = float(scaling)

    @staticmethod
    def _frequencies(cfg, lcfg, rope_type, init_functions):
        if rope_type == "default":
            base = float(lcfg.rope_parameters["rope_theta"])
            inv_freq = 1.0 / (base ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
            return inv_freq, 1.0
        return init_functions[rope_type](lcfg, "cpu")

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype):
        # position_ids (B, T) -> cos, sin (B, T, head_dim), computed in fp32
        if self.inv_freq.device != position_ids.device:
            self.inv_freq = self.inv_freq.to(position_ids.device)
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return (emb.cos() * self.attention_scaling).to(dtype), (emb.sin() * self.attention_scaling).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x (B, heads, T, d); cos/sin (B, T, d); neox-style rotate_half, as vLLM's llama rope
    cos, sin = cos[:, None], sin[:, None]
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: DraftConfig, first: bool = True):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        # first layer: [input_layernorm(embed) ‖ hidden_norm(h)]; later layers: input_layernorm(h)
        in_dim = 2 * cfg.hidden_size if first else cfg.hidden_size
        self.q_proj = nn.Linear(in_dim, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(in_dim, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(in_dim, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, repeat_kv: bool = True):
        # x (B, T, 2H) -> q (B, n_heads, T, d), k and v (B, n_heads, T, d) (KV heads repeated for GQA;
        # with repeat_kv=False (B, n_kv, T, d): TTT attention groups the query heads instead)
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if not repeat_kv:
            return q, k, v
        rep = self.n_heads // self.n_kv
        return q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)

    def out(self, o: torch.Tensor) -> torch.Tensor:
        # o (B, n_heads, T, d) -> (B, T, H)
        B, _, T, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    """One decoder layer: the first (`first=True`, the EAGLE-3 `midlayer`) attends over
    [input_layernorm(embed) ‖ hidden_norm(h)]; a later one (num_layers > 1) is a plain pre-norm Llama
    layer over h. `forward` takes the attention pattern as a function, so that inference
    (`Eagle3Draft.step`: a KV cache) and TTT (`train/ttt.py`: the step-0 prefix plus each position's
    own chain) run different patterns with the same weights, and every step goes through the
    layer's `forward` (FSDP2 gathers a sharded layer's weights, ZeRO-3 its submodules', there)."""

    def __init__(self, cfg: DraftConfig, first: bool = True):
        super().__init__()
        self.first = first
        self.norm_before_residual = first and cfg.norm_before_residual
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if first:
            self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, first)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attend,
        repeat_kv: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """embeds, hidden (B, T, H) (a later layer ignores embeds); cos, sin the RoPE tables of these
        positions; attend(q, k, v) -> o (B, n_heads, T, d), given this step's q (B, n_heads, T, d) and
        k, v (B, n_heads or, with repeat_kv=False, n_kv, T, d).
        -> (prenorm output (B, T, H), k, v)."""
        x, residual = self.attn_input(embeds, hidden)
        q, k, v = self.self_attn.qkv(x, cos, sin, repeat_kv=repeat_kv)
        return self.finish(residual, attend(q, k, v)), k, v

    def attn_input(self, embeds: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (attention input (B, T, 2H) first / (B, T, H) later, residual (B, T, H))."""
        if not self.first:
            return self.input_layernorm(hidden), hidden
        h = self.hidden_norm(hidden)
        # vLLM llama_eagle3 LlamaDecoderLayer: norm_before_residual keeps the normed h as the residual
        return torch.cat([self.input_layernorm(embeds), h], dim=-1), (
            h if self.norm_before_residual else hidden
        )

    def finish(self, residual: torch.Tensor, attn_o: torch.Tensor) -> torch.Tensor:
        # residual + attn, then + MLP -> prenorm output (B, T, H)
        h = residual + self.self_attn.out(attn_o)
        return h + self.mlp(self.post_attention_layernorm(h))


class KVCache:
    """The draft's own KV cache for inference (one sequence): per layer keys/values (B, n_kv, L, d),
    croppable. `update(k, v, layer)` is the call the serving loop's per-row cache also answers."""

    def __init__(self):
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return 0 if not self.k else self.k[0].shape[2]

    def update(self, k: torch.Tensor, v: torch.Tensor, layer: int):
        self.k[layer] = torch.cat([self.k[layer], k], dim=2) if layer in self.k else k
        self.v[layer] = torch.cat([self.v[layer], v], dim=2) if layer in self.v else v
        return self.k[layer], self.v[layer]

    def crop(self, length: int) -> None:
        """Keep the first `length` positions (roll back rejected drafts)."""
        for layer in self.k:
            self.k[layer], self.v[layer] = self.k[layer][:, :, :length], self.v[layer][:, :, :length]


def add_output_head(draft: nn.Module, cfg: DraftConfig) -> None:
    """What every kind's draft ends with, registered in this order (its init draws in it): the final norm,
    the lm_head over the draft vocabulary, the RoPE tables, and the vocab map (draft id i <-> target id
    i + d2t[i]; t2d[target id] = in the draft vocab)."""
    draft.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
    draft.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
    draft.rotary = Rotary(cfg)
    draft.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
    draft.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))


class Eagle3Draft(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)  # the target's, frozen
        if cfg.norm_before_fc:
            self.input_norm = RMSNorm(cfg.fc_in_features, cfg.rms_norm_eps)
        self.fc = nn.Linear(cfg.fc_in_features, cfg.hidden_size, bias=False)
        self.midlayer = MidLayer(cfg)
        # later layers under their published names `layers.1`, `layers.2`, ... (vLLM llama_eagle3)
        self.layers = nn.ModuleDict({str(i): MidLayer(cfg, first=False) for i in range(1, cfg.num_layers)})
        add_output_head(self, cfg)
        self.reset_parameters()

    @property
    def decoder_layers(self) -> list[MidLayer]:
        """The draft's decoder layers in order: the midlayer, then `layers.1`, ..."""
        return [self.midlayer, *self.layers.values()]

    def reset_parameters(self, std: float = 0.02) -> None:
        # fc and lm_head first, then each layer: a one-layer draft draws exactly what it always drew
        for lin in (self.fc, self.lm_head):
            nn.init.normal_(lin.weight, std=std)
        for layer in self.decoder_layers:
            for lin in (
                layer.mlp.gate_proj,
                layer.mlp.up_proj,
                layer.mlp.down_proj,
                *[getattr(layer.self_attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")],
            ):
                nn.init.normal_(lin.weight, std=std)

    # ---- pieces shared by inference and TTT

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """Target aux states (B, T, n_aux*H_t), concatenated in aux_layer_ids order -> g (B, T, H)."""
        aux = aux.to(self.fc.weight.dtype)
        if self.config.norm_before_fc:
            aux = self.input_norm(aux)  # one norm over all n_aux * H_t (vLLM combine_hidden_states)
        return self.fc(aux)

    def logits(self, prenorm: torch.Tensor) -> torch.Tensor:
        """(B, T, H) -> draft-vocab logits (B, T, V_d)."""
        return self.lm_head(self.norm(prenorm))

    def feedback(self, prenorm: torch.Tensor) -> torch.Tensor:
        """The last layer's output (B, T, H) -> the next step's h: itself, or (norm_output) its final norm."""
        return self.norm(prenorm) if self.config.norm_output else prenorm

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def set_vocab_map(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        self.d2t.copy_(d2t.to(torch.int64))
        self.t2d.copy_(t2d.to(torch.bool))

    # ---- inference

    def step(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        cache,
        attn_mask: torch.Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run new positions against the cache.

        input_ids (B, T): the token AFTER each position whose state is `hidden`;
        hidden (B, T, H): fused target states g (first step) or what the last step returned;
        position_ids (B, T): absolute positions of these new entries;
        cache: `KVCache` (one sequence) or the serving loop's per-row cache, whose `update(k, v, layer)`
        takes this step's keys / values (B, n_kv, T, d), the KV heads only, and returns every key / value of
        that layer the new entries may attend to;
        attn_mask (B, T, L) bool: which of those each new entry sees (None: causal over `KVCache`, within
        config.sliding_window; the serving loop's masks apply the window themselves, serve/decoding/masks.py);
        logits_to_keep: logits for the last that many positions only (0: all).
        Returns (the next step's h (B, T, H): `feedback(prenorm)`, logits (B, T or logits_to_keep, V_d));
        appends T entries to `cache`.
        """

        def attend_layer(layer: int):
            def attend(q, k, v):  # q (B, n_heads, T, d), k / v (B, n_kv, T, d) -> (B, n_heads, T, d)
                k_all, v_all = cache.update(k, v, layer)  # the KV heads only: 1/groups of repeated ones
                mask = attn_mask
                if mask is None:
                    # causal: new entry i sees every cached entry and new entries <= i (and, with a window,
                    # none older than the window: a KVCache slot is its position)
                    T, L = q.shape[2], k_all.shape[2]
                    mask = torch.ones(T, L, dtype=torch.bool, device=q.device).tril(diagonal=L - T)
                    if self.config.sliding_window:
                        mask = mask.triu(diagonal=L - T - self.config.sliding_window + 1)
                else:
                    mask = mask[:, None]  # (B, 1, T, L): the same for every head
                # enable_gqa: query head h reads KV head h // groups, as repeat_kv would give it (bitwise the
                # same on the CPU's memory-efficient kernel, which takes it without a repeated copy). On CUDA,
                # SDPA with a mask and grouped KV heads takes its math kernel, (q x kv) scores: the serving
                # loop's blocks instead (bounded memory for a long prompt's chunks)
                gqa = k_all.shape[1] != q.shape[1]
                if gqa and q.is_cuda:
                    m = mask if mask.dim() == 4 else mask[None, None]
                    o = attend_in_blocks(q, k_all, v_all, m, attention_scale(q.shape[-1]))  # (B, T, H, d)
                    return o.transpose(1, 2)
                return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, enable_gqa=gqa)

            return attend

        cos, sin = self.rotary(position_ids, hidden.dtype)
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)
        prenorm = hidden
        for i, layer in enumerate(self.decoder_layers):
            prenorm, _, _ = layer(embeds, prenorm, cos, sin, attend_layer(i), repeat_kv=False)
        return self.feedback(prenorm), self.logits(
            prenorm[:, -logits_to_keep:] if logits_to_keep else prenorm
        )

    def compile_math(self) -> None:
        """torch.compile the forward of the norms and the MLP, in place (module hooks still run around
        them). Inductor fuses their elementwise math (fp32 RMSNorm, SiLU x up) and keeps fewer
        activations for backward (per TTT step at gpt-oss size the MLP alone holds four (T, 17280)
        tensors eagerly). The matmuls stay cuBLAS; attention is compiled on its own
        (`train/attention.py`). Shapes become dynamic after the first recompile."""
        modules = [self.norm, *([self.input_norm] if self.config.norm_before_fc else [])]
        for m in self.decoder_layers:
            modules += [
                m.input_layernorm,
                m.post_attention_layernorm,
                m.mlp,
                *([m.hidden_norm] if m.first else []),
            ]
        for module in modules:
            module.forward = torch.compile(module.forward)

    def num_parameters(self, trainable_only: bool = True) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    @torch.no_grad()
    def fixed_round(self, ids: torch.Tensor, aux: torch.Tensor, pos: torch.Tensor) -> list[torch.Tensor]:
        """A round as this kind drafts it, on ids (B, T), aux (B, T, n_aux * H_t), pos (B, T): the prefix's
        logits (B, T, V_d), then one chained step on the draft's own output and its mapped guess (B, 1,
        V_d). Export compares these before and after its round trip (serve/interchange/export.py)."""
        cache = KVCache()
        hidden, first = self.step(ids, self.fuse(aux), pos, cache)
        guess = self.to_target_ids(first[:, -1:].argmax(-1))
        _, second = self.step(guess, hidden[:, -1:], pos[:, -1:] + 1, cache)
        return [first, second]


def attention_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
