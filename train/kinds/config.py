"""A draft's sizes and switches (`DraftConfig`): what a checkpoint's config.json records under "eyas" and
every kind's model is built from. Torch-free (the schema, the plan and the checkpoint format read it).

One flat class for every kind: a field only some kinds read says which (`kind`, mask_token_id, block_size,
attention_bias); the recipe refuses the others (DraftKind.own_options)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# the kind of a recipe, and of a record, that names none (written before kinds): EAGLE-3 (train/kinds/eagle3/)
DEFAULT_KIND = "eagle3"


# recipe `draft` switches
OPTIONS = (
    "norm_before_fc",
    "norm_before_residual",
    "num_layers",
    "norm_output",
    "sliding_window",
    "kind",
    "mask_token_id",
    "block_size",
    "attention_bias",
)


@dataclass
class DraftConfig:
    hidden_size: int  # H; equals the target's hidden size (the embedding is the target's)
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's vocab (embedding rows, t2d length)
    draft_vocab_size: int  # lm_head rows
    aux_layer_ids: list[int]  # vLLM convention: id k = input of decoder layer k = HF hidden_states[k]
    target_hidden_size: int | None = None  # H_t; fc takes len(aux_layer_ids) * H_t
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 131072
    # transformers-style rope parameters, copied from the target (gpt-oss: yarn, theta 150000)
    rope_parameters: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    hidden_act: str = "silu"
    target_model: str | None = None  # name or path of the target the head was trained for
    norm_before_fc: bool = False  # RMSNorm `input_norm` over the concatenated aux states before fc
    norm_before_residual: bool = False  # first layer: residual = hidden_norm(h) instead of h
    num_layers: int = 1  # decoder layers (the first takes [embed ‖ h], the rest are plain Llama layers)
    norm_output: bool = False  # the next step's h is norm(h_out) instead of h_out
    # attention over the last `sliding_window` positions only (a query at position p sees keys at p - W + 1
    # .. p, as transformers' and vLLM's windows); None: all of them
    sliding_window: int | None = None
    # the draft kind (train/kinds/): eagle3 (a chain of draft forwards), peagle (one forward, K drafts) or
    # dflash (one non-causal forward over a block)
    kind: str = DEFAULT_KIND
    # peagle, dflash: the input token of the mask slots (vLLM's pard_token / dflash_config.mask_token_id)
    mask_token_id: int | None = None
    # dflash: the slots of a block (the anchor and block_size - 1 mask slots; train/kinds/dflash/core.py)
    block_size: int | None = None
    # dflash: q/k/v/o projections with a bias (z-lab's gpt-oss drafts; vLLM qwen3_dflash attention_bias)
    attention_bias: bool = False
    # the draft's embed_tokens is its own (trained: speculators' P-EAGLE trains it), not the target's: read
    # from its file wherever it runs and exported with it (vLLM keeps a draft's distinct embedding)
    own_embedding: bool = False
    # the rounds of k drafts training made (DraftKind.trained_k, train/kinds/: 1 .. train.ttt_steps; a DFlash
    # draft's whole block only, unless train.block_lengths: random); the loop refuses a round its kind did
    # not train (untrained_k). None: not recorded (a draft imported from another trainer's layout)
    trained_k: list[int] | None = None

    def __post_init__(self):
        if self.target_hidden_size is None:
            self.target_hidden_size = self.hidden_size

    @property
    def fc_in_features(self) -> int:
        return len(self.aux_layer_ids) * self.target_hidden_size

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_target_config(cls, tcfg, aux_layer_ids, draft_vocab_size, target_model=None, **overrides):
        """Sizes from a Hugging Face target config (gpt-oss-120b: H=2880, 64 heads of 64, 8 KV heads)."""
        rope = dict(getattr(tcfg, "rope_parameters", None) or {})
        if not rope:
            rope = {"rope_type": "default", "rope_theta": float(getattr(tcfg, "rope_theta", 10000.0))}
        n_heads = overrides.pop("num_attention_heads", None) or tcfg.num_attention_heads
        head_dim = (
            overrides.pop("head_dim", None) or getattr(tcfg, "head_dim", None) or tcfg.hidden_size // n_heads
        )
        kw = dict(
            hidden_size=tcfg.hidden_size,
            num_attention_heads=n_heads,
            num_key_value_heads=overrides.pop("num_key_value_heads", None)
            or getattr(tcfg, "num_key_value_heads", None)
            or n_heads,
            head_dim=head_dim,
            intermediate_size=overrides.pop("intermediate_size", None) or tcfg.intermediate_size,
            vocab_size=tcfg.vocab_size,
            draft_vocab_size=draft_vocab_size,
            aux_layer_ids=list(aux_layer_ids),
            target_hidden_size=tcfg.hidden_size,
            rms_norm_eps=overrides.pop("rms_norm_eps", None) or getattr(tcfg, "rms_norm_eps", 1e-5),
            max_position_embeddings=getattr(tcfg, "max_position_embeddings", 131072),
            rope_parameters=rope,
            target_model=target_model,
        )
        for key in (*OPTIONS, "trained_k"):  # trained_k: what training records, not a recipe switch
            if overrides.get(key) is not None:
                kw[key] = overrides.pop(key)
        unknown = {k: v for k, v in overrides.items() if v is not None}
        if unknown:
            raise ValueError(f"unknown draft overrides: {sorted(unknown)}")
        return cls(**kw)
