"""gpt-oss's published configuration, for what eyas builds and plans without the hub: the values the hub's
config.json of openai/gpt-oss-120b and -20b hold (`eyas plan`'s built-in copy, the full-width target of
data/demo_target/full_width.py) and the ids of the harmony special tokens of their o200k_harmony
tokenizer."""

# the hub configs of the gpt-oss targets (openai/gpt-oss-120b, -20b config.json), for planning offline
KNOWN_TARGETS = {
    "openai/gpt-oss-120b": {"num_hidden_layers": 36, "num_local_experts": 128},
    "openai/gpt-oss-20b": {"num_hidden_layers": 24, "num_local_experts": 32},
}
GPT_OSS_SHARED = dict(
    vocab_size=201088,
    hidden_size=2880,
    intermediate_size=2880,
    head_dim=64,
    num_attention_heads=64,
    num_key_value_heads=8,
    num_experts_per_tok=4,
    sliding_window=128,
    max_position_embeddings=131072,
    tie_word_embeddings=False,
    # the hub checkpoints store the MoE experts in MXFP4, everything else in bf16
    quantization_config={
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    },
    rope_parameters={
        "rope_type": "yarn",
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
        "rope_theta": 150000.0,
    },
)

# o200k_harmony's special tokens (openai/gpt-oss-120b tokenizer_config.json / generation_config.json):
# eos <|return|>, pad <|endoftext|>, and <|call|> ends a tool call; the rest of 200000..201087 is reserved
SPECIAL_TOKEN_IDS = {
    "<|startoftext|>": 199998,
    "<|endoftext|>": 199999,
    "<|return|>": 200002,
    "<|constrain|>": 200003,
    "<|channel|>": 200005,
    "<|start|>": 200006,
    "<|end|>": 200007,
    "<|message|>": 200008,
    "<|call|>": 200012,
}
# the hub config's values the shared ones above leave at transformers' defaults, or set otherwise
HUB_CONFIG_REST = {
    "architectures": ["GptOssForCausalLM"],  # what vLLM picks the model class by
    "eos_token_id": 200002,
    "pad_token_id": 199999,
    "router_aux_loss_coef": 0.9,
    "initial_context_length": 4096,
}
GENERATION_EOS_IDS = [200002, 199999, 200012]  # generation_config.json: <|return|>, <|endoftext|>, <|call|>
