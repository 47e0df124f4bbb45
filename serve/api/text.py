"""From emitted token ids to response text: incremental detokenization (TextStream), a completion's
text (PlainText), and for chats with harmony targets (gpt-oss) the split of the output into its
`analysis` channel (`reasoning_content`) and its `final` channel (`content`), as vLLM's harmony
parser returns them (ChatText). PlainText and ChatText both turn ids into (reasoning, content) deltas.

Token ids are what the server returns exactly (`token_ids`); the text is derived from them.
"""

from __future__ import annotations

from eyas.data.chat import HARMONY_TOKENS, is_harmony


class TextStream:
    """Token ids -> text deltas. Decodes from a few tokens back (the prefix / read offsets of vLLM's
    and TGI's incremental detokenizers) and holds back a trailing partial UTF-8 character."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tok, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.prefix = self.read = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip)

    def push(self, ids: list[int]) -> str:
        self.ids += ids
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """What is still held back at the end."""
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :]


class PlainText:
    """Token ids -> ("", text delta): a completion's text, with ChatText's interface (no reasoning)."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.stream = TextStream(tokenizer, skip_special_tokens)

    def push(self, ids: list[int]) -> tuple[str, str]:
        return "", self.stream.push(ids)

    def flush(self) -> tuple[str, str]:
        return "", self.stream.flush()


class ChatText:
    """Assistant output -> (reasoning delta, content delta). Harmony targets: header tokens
    (`<|start|>`, role, `<|channel|>NAME<|message|>`) route the message body that follows to
    `reasoning` (analysis) or `content` (final and any other channel); other targets: everything
    is content."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tok = tokenizer
        self.harmony = is_harmony(tokenizer)
        self.streams = {
            "reasoning": TextStream(tokenizer, True),
            "content": TextStream(tokenizer, skip_special_tokens),
        }
        if self.harmony:
            vocab = tokenizer.get_vocab()
            self.special = {vocab[t]: t for t in HARMONY_TOKENS if t in vocab}
        self.state, self.channel, self.name = "header", "content", []
        self.all_ids: list[int] = []
        self.routed_any = False

    def push(self, ids: list[int]) -> tuple[str, str]:
        if not self.harmony:
            return "", self.streams["content"].push(ids)
        self.all_ids += ids
        routed = {"reasoning": [], "content": []}
        for t in ids:
            sp = self.special.get(t)
            if sp == "<|channel|>":
                self.state, self.name = "channel", []
            elif sp == "<|message|>":
                if self.state == "channel":
                    name = self.tok.decode(self.name).strip()
                    self.channel = "reasoning" if name == "analysis" else "content"
                self.state = "body"
            elif sp in ("<|end|>", "<|return|>", "<|call|>", "<|start|>"):
                self.state = "header"
            elif self.state == "channel":
                self.name.append(t)
            elif self.state == "body":
                routed[self.channel].append(t)
                self.routed_any = True
        return (
            self.streams["reasoning"].push(routed["reasoning"]) if routed["reasoning"] else "",
            self.streams["content"].push(routed["content"]) if routed["content"] else "",
        )

    def flush(self) -> tuple[str, str]:
        """The held-back rest. Output that never opened a harmony message comes out whole as content."""
        if self.harmony and not self.routed_any and self.all_ids:
            return "", self.tok.decode(self.all_ids, skip_special_tokens=True)
        return self.streams["reasoning"].flush(), self.streams["content"].flush()
