"""A draft's sizes and switches: what a checkpoint's config.json records under "eyas" and every kind's
model is built from. Torch-free (the schema, the plan and the checkpoint format read it).

`DraftConfig` holds the fields every kind reads; each kind's own class adds its own, in its home
(train/kinds/<name>/config.py: Eagle3Config's layer options, PEagleConfig's mask token, DFlashConfig's block),
and `DraftConfig(kind=..., ...)` is that class: the kind picks it, as `draft.kind` picks the recipe's
section (recipes/draft.py). A record written before the kinds had their own classes lists every kind's
fields, another kind's at null or false: `from_dict` drops those and refuses one that is set."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

# the kind of a recipe, and of a record, that names none (written before kinds): EAGLE-3 (train/kinds/eagle3/)
DEFAULT_KIND = "eagle3"


# recipe `draft` switches (each kind's class has those it reads)
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
    num_layers: int = 1  # decoder layers
    # the draft kind (train/kinds/): eagle3 (a chain of draft forwards), peagle (one forward, K drafts) or
    # dflash (one non-causal forward over a block); each kind's class sets its own
    kind: str = DEFAULT_KIND
    # the draft's embed_tokens is its own (trained: speculators' P-EAGLE trains it), not the target's: read
    # from its file wherever it runs and exported with it (vLLM keeps a draft's distinct embedding)
    own_embedding: bool = False
    # the rounds of k drafts training made (DraftKind.trained_k, train/kinds/: 1 .. train.ttt_steps; a DFlash
    # draft's whole block only, unless train.block_lengths: random); the loop refuses a round its kind did
    # not train (untrained_k). None: not recorded (a draft imported from another trainer's layout)
    trained_k: list[int] | None = None

    # kind -> its class, filled as each kind's class is defined (its `kind` default names it)
    classes: ClassVar[dict[str, type[DraftConfig]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            DraftConfig.classes[cls.__dict__["kind"]] = cls

    def __new__(cls, *args, **kwargs):
        """DraftConfig(kind=K, ...) is K's own class (Eagle3Config when no kind is named)."""
        if cls is DraftConfig:
            cls = own_class(kwargs.get("kind", DEFAULT_KIND))
        return super().__new__(cls)

    def __post_init__(self):
        if own_class(self.kind) is not type(self):
            raise ValueError(f"{type(self).__name__} with kind {self.kind!r}: that kind's class is another")
        if self.target_hidden_size is None:
            self.target_hidden_size = self.hidden_size

    @property
    def fc_in_features(self) -> int:
        return len(self.aux_layer_ids) * self.target_hidden_size

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> DraftConfig:
        """A record (config.json's "eyas" draft_config, or keyword fields) -> its kind's class; another
        kind's field is dropped at null or false (a record written before each kind had its own class) and
        refused otherwise, as is a field no kind has."""
        own = own_class(record.get("kind", DEFAULT_KIND))
        mine = {f.name for f in fields(own)}
        others = {f.name for c in DraftConfig.classes.values() for f in fields(c)} - mine
        stray = sorted(
            k for k, v in record.items() if k not in mine and (k not in others or v not in (None, False))
        )
        if stray:
            raise ValueError(f"draft config of kind {own.kind!r}: {', '.join(stray)} not fields of that kind")
        return own(**{k: v for k, v in record.items() if k in mine})

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
        return cls.from_dict(kw)


def own_class(kind: str) -> type[DraftConfig]:
    """The DraftConfig class of `kind` (train/kinds/<kind>/config.py)."""
    try:
        return DraftConfig.classes[kind]
    except KeyError:
        known = ", ".join(DraftConfig.classes)
        raise ValueError(f"unknown draft kind {kind!r} (expected one of {known})") from None


def layer_option(cfg: DraftConfig, name: str) -> Any:
    """An EAGLE-3 layer option of `cfg` (norm_before_fc, norm_before_residual, norm_output, sliding_window;
    Eagle3Config's, which P-EAGLE's extends), None for a kind whose layer has none (DFlash's Qwen3 layers):
    for the engines' checks, which ask every kind's draft."""
    return getattr(cfg, name, None)
