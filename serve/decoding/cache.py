"""Per-row KV cache for batched speculative decoding (the target's, and the draft's).

Design (correctness first, memory second):

  * One buffer per layer, (rows, kv_heads, slots, head_dim), zero-initialised. Row b of the
    running batch owns row b of every buffer; its committed entries live in slots
    0 .. C_b-1 and slot j always holds position j. Rows have their own lengths: a short request
    next to a long one wastes only padding slots, and which slots a query may see is decided by
    an explicit mask (masks.py), never by the buffer's shape.
  * Every layer keeps every entry, the target's sliding-window layers included. The window is
    applied by the mask, so rolling back a rejected draft is the same operation on every layer:
    nothing a window already evicted ever has to be restored. The cost is memory: a
    sliding-window layer holds C_b entries instead of `window` (gpt-oss alternates sliding and
    full layers, so about 2x the KV of an evicting cache). That is the trade: a rollback that
    cannot be wrong over a cache that is as small as possible.
  * Speculative entries (a draft chain or tree, a verification) are written after the committed
    ones. Rolling back = moving the accepted entries down to C_b.. and raising C_b; rejected ones
    stay in place as garbage that no mask lets anyone see and the next write overwrites.
  * Requests join at the end of the batch and leave by swapping the last row into their place,
    so joining and leaving cost one row copy, and the running rows are always the view
    `buffer[:B]` (no gather per forward).

The model sees this object only through `update(key, value, layer_idx) -> (keys, values)`, the
call every Hugging Face attention layer makes on `past_key_values`; nothing here relies on a
transformers Cache class or its crop / sliding-window semantics, which have changed between
releases (`DynamicCache.crop(0)` used to empty the cache). `check_routed` guards the one
assumption: every decoder layer does call `update` once per forward.
"""

from __future__ import annotations

import torch


class RowKVCache:
    """KV entries of `rows` independent sequences for a model with any number of layers."""

    def __init__(self, max_rows: int, min_slots: int = 256, max_slots: int | None = None):
        self.max_rows = max_rows
        self.min_slots = min_slots
        self.max_slots = (
            max_slots  # where doubling stops (the context): a 128K row holds ~128K slots, not 256K
        )
        self.keys: dict[int, torch.Tensor] = {}  # layer -> (max_rows, kv_heads, slots, head_dim)
        self.values: dict[int, torch.Tensor] = {}
        self.slots = 0
        # the current forward: rows [row0, row0 + n) write their new entries at `write_slots` (n, q)
        # and attend over slots [0, kv_len)
        self._row0 = 0
        self._write: torch.Tensor | None = None
        self._write_on: dict[torch.device, torch.Tensor] = {}
        self._kv_len = 0
        self.updates = 0  # update() calls since plan(): check_routed

    # ------------------------------------------------------------------ one forward

    def plan(self, row0: int, write_slots: torch.Tensor, kv_len: int) -> None:
        """Before a forward over rows row0 .. row0+n-1: new entry i of row b goes to slot
        write_slots[b, i] (n, q); attention spans slots [0, kv_len)."""
        self._row0, self._write, self._kv_len = row0, write_slots, kv_len
        self._write_on = {write_slots.device: write_slots}
        self.updates = 0
        self.reserve(kv_len)

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """key/value (n, kv_heads, q, head_dim) -> every slot up to kv_len (n, kv_heads, kv_len, head_dim)."""
        self.updates += 1
        if layer_idx not in self.keys:  # on the layer's own device and dtype (targets split across GPUs)
            shape = (self.max_rows, key.shape[1], self.slots, key.shape[3])
            self.keys[layer_idx] = torch.zeros(shape, device=key.device, dtype=key.dtype)
            self.values[layer_idx] = torch.zeros(shape, device=key.device, dtype=value.dtype)
        if key.device not in self._write_on:
            self._write_on[key.device] = self._write.to(key.device)
        write = self._write_on[key.device]
        n, q = write.shape
        rows = slice(self._row0, self._row0 + n)
        idx = write[:, None, :, None].expand(n, key.shape[1], q, key.shape[3])
        kb, vb = self.keys[layer_idx][rows], self.values[layer_idx][rows]
        kb.scatter_(2, idx, key.to(kb.dtype))
        vb.scatter_(2, idx, value.to(vb.dtype))
        return kb[:, :, : self._kv_len], vb[:, :, : self._kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_len

    def check_routed(self, num_layers: int) -> None:
        """After a forward: every attention layer must have gone through `update` exactly once."""
        if self.updates != num_layers:
            raise RuntimeError(
                f"the target's attention layers called past_key_values.update {self.updates} times for "
                f"{num_layers} layers in one forward; this transformers release does not route keys and "
                "values through the cache the way the speculative loop needs (attention must call "
                "`past_key_values.update(key, value, layer_idx)`)"
            )

    # ------------------------------------------------------------------ storage

    def reserve(self, slots: int) -> None:
        """Grow every buffer to at least `slots` slots (doubling, up to max_slots), keeping the contents."""
        if slots <= self.slots:
            return
        new = max(2 * self.slots, self.min_slots)
        new = max(slots, min(new, self.max_slots) if self.max_slots else new)
        for store in (self.keys, self.values):
            for layer, buf in store.items():
                grown = torch.zeros(
                    buf.shape[0], buf.shape[1], new, buf.shape[3], device=buf.device, dtype=buf.dtype
                )
                grown[:, :, : self.slots] = buf
                store[layer] = grown
        self.slots = new

    def keep(self, row0: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Rows row0.. : move slot src[b, i] to slot dst[b, i] (n, m) in every layer (accepted tree
        paths down to the committed end). Pairs may repeat (padding); a source never lies below
        its destination's row end, and values are read before any is written."""
        n, m = src.shape
        rows = slice(row0, row0 + n)
        on: dict[
            torch.device, tuple[torch.Tensor, torch.Tensor]
        ] = {}  # the indices, once per device (split targets)
        for store in (self.keys, self.values):
            for buf in store.values():
                b = buf[rows]
                if buf.device not in on:
                    on[buf.device] = (
                        src.to(buf.device)[:, None, :, None],
                        dst.to(buf.device)[:, None, :, None],
                    )
                s, d = (x.expand(n, b.shape[1], m, b.shape[3]) for x in on[buf.device])
                b.scatter_(2, d, b.gather(2, s))

    def move_row(self, src: int, dst: int) -> None:
        """Row dst takes row src's entries (a request leaving: the last row fills its place)."""
        if src == dst:
            return
        for store in (self.keys, self.values):
            for buf in store.values():
                buf[dst] = buf[src]

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for s in (self.keys, self.values) for b in s.values())
