"""The demo target's tokenizer: a small byte-level BPE with gpt-oss's harmony chat format.

The BPE is trained on the demo corpus, so its words are mostly single tokens, while the
byte-level alphabet still encodes (and exactly decodes) any text, e.g. ShareGPT prompts.
Digits are always single tokens, an optional leading space included (" 37" -> " 3", "7").

Harmony special tokens: `<|start|>`, `<|message|>`, `<|channel|>`, `<|end|>`, `<|return|>`
(end of generation, the eos token), plus `<|startoftext|>` (bos, never added automatically,
as in gpt-oss) and `<|pad|>`. A conversation renders as

    <|start|>system<|message|>You are a helpful assistant.<|end|>
    <|start|>user<|message|>QUESTION<|end|>
    <|start|>assistant<|channel|>analysis<|message|>REASONING<|end|>
    <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>

(without the line breaks); the generation prompt is `<|start|>assistant`.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

BOS, PAD, EOS = "<|startoftext|>", "<|pad|>", "<|return|>"
HARMONY_TOKENS = ("<|start|>", "<|message|>", "<|channel|>", "<|end|>", EOS)
SPECIAL_TOKENS = (PAD, BOS, *HARMONY_TOKENS)
DEFAULT_SYSTEM = "You are a helpful assistant."

# Harmony rendering in the manner of gpt-oss's own template: a system message (a default one if
# the conversation has none); only the LAST assistant turn, when it ends the conversation, shows
# its reasoning (`thinking`, analysis channel) and ends in <|return|>; earlier assistant turns keep
# just their final channel, ended by <|end|>. Content may be a string or a list of text parts.
CHAT_TEMPLATE = (
    """\
{%- macro text(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content is iterable -%}
{%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if messages and messages[0].role in ['system', 'developer'] -%}
{{- '<|start|>system<|message|>' + text(messages[0].content) + '<|end|>' -}}
{%- set turns = messages[1:] -%}
{%- else -%}
{{- '<|start|>system<|message|>"""
    + DEFAULT_SYSTEM
    + """<|end|>' -}}
{%- set turns = messages -%}
{%- endif -%}
{%- for message in turns -%}
{%- if message.role == 'assistant' -%}
{%- if loop.last and not add_generation_prompt -%}
{%- if message.thinking -%}
{{- '<|start|>assistant<|channel|>analysis<|message|>' + message.thinking + '<|end|>' -}}
{%- endif -%}
{{- '<|start|>assistant<|channel|>final<|message|>' + text(message.content) + '<|return|>' -}}
{%- else -%}
{{- '<|start|>assistant<|channel|>final<|message|>' + text(message.content) + '<|end|>' -}}
{%- endif -%}
{%- else -%}
{{- '<|start|>' + message.role + '<|message|>' + text(message.content) + '<|end|>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|start|>assistant' -}}
{%- endif -%}"""
)

# Template words, which never occur in message texts; repeated so that the BPE makes them whole tokens.
_TEMPLATE_WORDS = ("system", "user", "assistant", "analysis", "final", DEFAULT_SYSTEM) * 64


def build_tokenizer(texts: Iterable[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of (at most) `vocab_size` tokens on `texts` and wrap it, with the
    harmony special tokens and chat template, as a `PreTrainedTokenizerFast` (left padding)."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r" ?[0-9]"), behavior="isolated"),  # one token per digit
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([*_TEMPLATE_WORDS, *texts], trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(HARMONY_TOKENS[:-1]),
        padding_side="left",
        model_max_length=2048,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def corpus_texts(records: Iterable[dict]) -> list[str]:
    """Every message text of messages records (content, and thinking where present)."""
    return [m[key] for r in records for m in r["messages"] for key in ("content", "thinking") if m.get(key)]
