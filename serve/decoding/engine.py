"""Continuous-batching speculative decoding: many requests in flight, each accepting its own prefix.

State of a running row b between iterations (n_b = tokens in the target's cache):

    target cache   x_0 .. x_{n_b-1}                (cache.py: every layer, sliding ones included)
    pending        x_{n_b}: the last emitted token, not yet run through the target
    draft cache    step-0 entries for positions 0 .. n_b-1 (from the target's own aux states)
    draft head     logits and output state of the last step-0 entry: the distribution of x_{n_b+1}

One engine step:

    1. admit      waiting requests join (as many as free rows): one left-padded target prefill per
                  group (its first token is sampled here: TTFT), then the draft's step 0 over the prompt
    2. draft      per row a tree (tree.py; a chain is the 1-wide tree): depth 1 from the draft head,
                  then steps-1 draft forwards, each new node attending to the committed entries and
                  its own ancestors only
    3. verify     ONE target forward over every row's N tree tokens at positions n_b + depth, with a
                  tree attention mask; sampling.verify walks each row's tree (greedy, or speculative
                  sampling at the row's temperature / top-k / top-p with its own generator)
    4. commit     each row keeps its accepted path: the target cache moves those entries down to
                  n_b.. (a chain's are already there), the rest become garbage nobody can see; the
                  emitted tokens (accepted + the next one) are cut at eos / stop ids / max_tokens
    5. draft step 0 on the accepted path (tokens after each accepted node, the target's aux states
                  there), left-padded across rows; its last entry gives the next draft head
    6. retire     finished rows leave (the last row takes their place)

Without a draft the same engine decodes one token per row per step (the baseline at the same
concurrency). Statistics per verification: `emitted`, the tokens it emitted (eos, a stop id or max_tokens
may cut them short), and `accepted`, the drafts it accepted whether or not a cut dropped some: vLLM's
scheduler counts them so, and tau is compared with vLLM's counters exactly.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from eyas.data.target import HiddenStateTap, compute_dtype, decoder_layers, input_device
from eyas.recipes.defaults import DECODE_RESERVE, PREFILL_TOKENS, spare_slots
from eyas.recipes.types import TreeShape
from eyas.serve.decoding import masks as M
from eyas.serve.decoding.cache import RowKVCache
from eyas.serve.decoding.sampling import RowSampling, SamplingParams, sample, verify
from eyas.train.blocked_attention import memory_efficient
from eyas.train.kinds import kind_of


def shapes_for(draft, shapes: list[TreeShape]) -> list[TreeShape]:
    """The shapes `draft` proposes: every chain and tree for EAGLE-3, chains for P-EAGLE (one forward drafts
    a chain of K; train/kinds/ DraftKind.chains_only)."""
    return [s for s in shapes if s.is_chain or not kind_of(draft.config).chains_only]


def check_shape(draft, shape: TreeShape) -> None:
    """ValueError unless `draft` proposes `shape`: trees from EAGLE-3 only, what its kind can draft at all
    (a DFlash block's drafts at most: DraftKind.k_problem), and only the rounds it trained where its kind
    serves those (DraftKind.untrained_k)."""
    if not shapes_for(draft, [shape]):
        raise ValueError(
            f"a {draft.config.kind} draft proposes a chain from one forward, not a {shape.label}"
        )
    kind = kind_of(draft.config)
    why = kind.k_problem(draft.config, shape.steps) or kind.untrained_k(draft.config.trained_k, shape.steps)
    if why:
        raise ValueError(why)


@dataclass(eq=False)  # requests compare by identity (abort, removal from queues)
class Request:
    prompt: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    id: str = ""
    arrival: float = field(default_factory=time.perf_counter)
    # called with (request, new token ids) after every emission; `request.finished` tells the end
    on_tokens: Callable | None = None
    # --- filled by the engine
    tokens: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    emitted: list[int] = field(default_factory=list)  # per verification: tokens emitted
    accepted: list[int] = field(default_factory=list)  # per verification: accepted drafts among them
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class StepStats:
    """One engine forward group, for the cost model of k advice (eval/advice.py)."""

    kind: str  # "prefill" | "decode"
    rows: int
    tokens_per_row: int  # N verified per row (1 without speculation)
    context: int  # mean committed length
    target_s: float
    total_s: float
    emitted: int


class Engine:
    """Speculative (draft given) or plain decoding of many concurrent requests on one target."""

    def __init__(
        self,
        target,
        draft=None,
        shape: TreeShape | None = None,
        *,
        max_batch: int = 64,
        eos_ids=(),
        prefill_tokens: int = PREFILL_TOKENS,
        seed: int = 0,
        max_model_len: int | None = None,
        profile: bool = False,
    ):
        if (draft is None) != (shape is None):
            raise ValueError("give both a draft and a chain/tree shape, or neither (plain decoding)")
        self.model, self.draft, self.shape = target, draft, shape
        self.config = (
            target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
        )
        # the loop passes explicit ragged / tree masks, and prefills a long prompt in chunks of at most
        # `prefill_tokens` tokens: SDPA, or eager's math in query blocks (train/blocked_attention.py), bound
        # its memory
        memory_efficient(target)
        self.window = M.model_window(self.config)
        self.num_layers = len(decoder_layers(target))
        self.vocab = target.get_output_embeddings().weight.shape[0]
        # Per-row state (ids, positions, masks, sampling) lives on the target's input device. A target
        # split across devices (target.device_map) runs each layer where accelerate placed it: its
        # hooks carry the activations and masks along, each layer's KV stays on that layer's device
        # (cache.py), and the logits come back to the input device; the aux states are gathered here.
        self.device = input_device(target)
        if draft is not None and draft.fc.weight.device != self.device:
            raise ValueError(
                f"the draft is on {draft.fc.weight.device}; the serving loop runs it on the target's "
                f"input device, {self.device} (data.target.input_device(target)): load it there"
            )
        self.dtype = compute_dtype(target)
        self.max_batch = max_batch
        self.eos_ids = set(int(e) for e in eos_ids)
        self.prefill_tokens = prefill_tokens
        self.max_model_len = max_model_len or getattr(self.config, "max_position_embeddings", None) or 1 << 30
        self.profile = profile
        # growth by doubling stops at the context (and a round's speculative entries past it)
        spare = spare_slots(shape.num_draft_tokens, shape.steps, shape.topk) if shape else 1
        self.tcache = RowKVCache(max_batch, max_slots=self.max_model_len + spare)
        self.waiting: deque[Request] = deque()
        self.rows: list[Request] = []
        self.n: list[int] = []  # committed target entries per row
        self.pending = torch.zeros(max_batch, dtype=torch.long, device=self.device)
        self.gens: list[torch.Generator] = []
        self._seeds = torch.Generator().manual_seed(seed)
        self._ids = itertools.count()
        self.stats: list[StepStats] = []
        self.tap = None
        self.closed = False
        if draft is not None:
            # the draft kind's round (train/kinds/ DraftKind.proposal, .commit): its proposal (a tree of draft
            # forwards, or K drafts from one), and what it keeps of each committed position (EAGLE-3's and
            # P-EAGLE's step 0: an entry and the head's next draft; DFlash's context keys)
            self._proposal, self._commit_fn = kind_of(draft.config).round
            check_shape(draft, shape)
            self.tap = HiddenStateTap(target, draft.config.aux_layer_ids)
            self.dcache = RowKVCache(max_batch, max_slots=self.max_model_len + spare)
            H = draft.config.hidden_size
            dd = draft.fc.weight
            self.head_logits = torch.zeros(max_batch, draft.config.draft_vocab_size, device=dd.device)
            self.head_state = torch.zeros(max_batch, H, device=dd.device, dtype=dd.dtype)

    # ------------------------------------------------------------------ requests

    def validate(self, prompt: list[int]) -> None:
        """Raise ValueError for a prompt this engine cannot take (reads nothing it changes)."""
        if not prompt:
            raise ValueError("the prompt is empty")
        if len(prompt) + 1 > self.max_model_len:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens; this model's maximum context length is "
                f"{self.max_model_len} tokens, which leaves no room to generate"
            )
        bad = [t for t in prompt if not (isinstance(t, int) and 0 <= t < self.vocab)]
        if bad:
            raise ValueError(f"prompt token id {bad[0]!r} is outside the vocabulary [0, {self.vocab})")

    def add(self, req: Request) -> Request:
        self.validate(req.prompt)
        if not req.id:
            req.id = f"req-{next(self._ids)}"
        self.waiting.append(req)
        return req

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.rows)

    def close(self) -> None:
        """Remove the hooks this engine put on the target (the target may outlive the engine)."""
        if self.tap is not None:
            self.tap.remove()
            self.tap = None
        self.closed = True

    # ------------------------------------------------------------------ the loop

    @torch.no_grad()
    def step(self) -> None:
        if self.closed:
            raise RuntimeError("this engine was closed")
        self.retire()  # rows aborted since the last step free their place first
        self._admit()
        for b in range(len(self.rows)):  # prompt + output (pending x_n included) at the context limit
            if self.n[b] + 1 >= self.max_model_len:
                self._finish(b, "length")
        self.retire()
        if self.rows:
            self._decode()
            self.retire()

    def run(self, requests: list[Request]) -> list[Request]:
        """Add every request and step until all are finished (at most max_batch at a time)."""
        for r in requests:
            self.add(r)
        while self.busy:
            self.step()
        return requests

    # ------------------------------------------------------------------ forwards

    def _target(
        self,
        row0: int,
        ids: torch.Tensor,
        pos: torch.Tensor,
        committed: torch.Tensor,
        write: torch.Tensor,
        vis: torch.Tensor,
        kv_len: int,
        last_only: bool,
    ):
        """One target forward appending ids (n, q) to rows row0..; -> logits (n, q or 1, V) fp32, aux."""
        full = M.attention_allowed(committed, write, pos, vis, kv_len)
        win = M.attention_allowed(committed, write, pos, vis, kv_len, self.window) if self.window else None
        self.tcache.plan(row0, write, kv_len)
        out = self.model(
            input_ids=ids,
            position_ids=pos,
            past_key_values=self.tcache,
            use_cache=True,
            attention_mask=M.target_masks(self.config, full, win, self.dtype),
            logits_to_keep=1 if last_only else 0,
        )
        self.tcache.check_routed(self.num_layers)
        aux = self.tap.aux.to(self.device) if self.tap is not None else None
        return out.logits.to(self.device).float(), aux

    # ------------------------------------------------------------------ 1. admit

    def _admit(self) -> None:
        free = self.max_batch - len(self.rows)
        group: list[Request] = []
        while self.waiting and free > 0:
            req = self.waiting[0]
            longest = max([len(r.prompt) for r in group] + [len(req.prompt)])
            if group and longest * (len(group) + 1) > self.prefill_tokens:
                self._prefill(group)
                group = []
                continue
            group.append(self.waiting.popleft())
            free -= 1
        if group:
            self._prefill(group)

    def _prefill(self, group: list[Request]) -> None:
        """The group's prompts, left-padded to the longest, through the target in forwards of at most
        `prefill_tokens` tokens (chunked prefill: each chunk of columns a ragged append to the cache, rows
        whose padding ends inside it left-padded within it), each chunk then through the draft's step 0; the
        last chunk's logits give every row its first token (TTFT)."""
        row0, n = len(self.rows), len(group)
        dev = self.device
        lens = torch.tensor([len(r.prompt) for r in group], device=dev)
        q = max(len(r.prompt) for r in group)
        ids = torch.zeros(n, q, dtype=torch.long, device=dev)
        for b, r in enumerate(group):
            ids[b, q - len(r.prompt) :] = torch.tensor(r.prompt, device=dev)
        for r in group:
            g = torch.Generator(device=dev)
            g.manual_seed(
                r.params.seed
                if r.params.seed is not None
                else int(torch.randint(0, 2**62, (1,), generator=self._seeds))
            )
            self.gens.append(g)
        self.rows.extend(group)
        self.n.extend(len(r.prompt) for r in group)
        rows = self._sampling(row0, row0 + n)
        t0 = time.perf_counter()
        pad, width = q - lens, max(1, min(q, self.prefill_tokens // n))
        self._reserve(group)
        for s in range(0, q, width):
            e = min(q, s + width)
            done = (s - pad).clamp(min=0)  # each row's tokens already in the cache
            real = (e - pad.clamp(min=s)).clamp(min=0)  # its tokens in this chunk (left-padded within it)
            write, vis = M.left_padded_slots(done, real, e - s), M.causal_vis(real, e - s)
            pos = (torch.arange(s, e, device=dev)[None] - pad[:, None]).clamp(
                min=0
            )  # real token j: position j
            kv_len = int(done.max()) + e - s  # past every slot written (padding goes after the real entries)
            logits, aux = self._target(row0, ids[:, s:e], pos, done, write, vis, kv_len, last_only=True)
            if e == q:
                first = sample(logits[:, -1], rows)
                self.pending[row0 : row0 + n] = first
            if self.draft is not None:
                # step 0 over the chunk: the entry at position j pairs x_j's aux state with x_{j+1}
                dids = ids[:, s + 1 : e + 1] if e < q else torch.cat([ids[:, s + 1 :], first[:, None]], 1)
                hidden = self.draft.fuse(aux)
                h, dl = self._commit(row0, dids, hidden, pos, done, write, pos, vis, kv_len, last_only=True)
        if self.draft is not None and dl is not None:
            self.head_logits[row0 : row0 + n] = dl[:, -1].float()
            self.head_state[row0 : row0 + n] = h[:, -1]
        now = time.perf_counter()
        for b, t in enumerate(first.tolist()):
            self._emit(row0 + b, [t], now)
        if self.profile:
            self.stats.append(StepStats("prefill", n, q, 0, now - t0, now - t0, n))

    def _reserve(self, group: list[Request]) -> None:
        """Grow the caches once for a joining group: each request's prompt (every write of its chunks lies
        below it) and up to DECODE_RESERVE tokens of its answer, with a round's speculative entries, at most
        the context. A long prompt's caches are not grown (copied) chunk by chunk; a longer answer grows them
        by doubling as it decodes. (The caches are max_batch rows wide: `eyas serve`'s max_tokens, the whole
        context, must not reserve the whole context for every row.)"""
        spare = self.tcache.max_slots - self.max_model_len
        need = max(len(r.prompt) + min(r.params.max_tokens, DECODE_RESERVE) for r in group) + spare
        self.tcache.reserve(min(need, self.tcache.max_slots))
        if self.draft is not None:
            self.dcache.reserve(min(need, self.dcache.max_slots))

    # ------------------------------------------------------------------ 2-5. one iteration

    def _decode(self) -> None:
        B = len(self.rows)
        dev = self.device
        t0 = time.perf_counter()
        n = torch.tensor(self.n, device=dev)
        n_max, n_mean = max(self.n), sum(self.n) // B  # from the host copy: no device sync
        rows = self._sampling(0, B)
        if self.draft is None:
            logits, _ = self._target(
                0,
                self.pending[:B, None],
                n[:, None],
                n,
                n[:, None],
                torch.ones(B, 1, 1, dtype=torch.bool, device=dev),
                n_max + 1,
                False,
            )
            self._sync()
            t1 = time.perf_counter()
            nxt = sample(logits[:, 0], rows).tolist()
            now = time.perf_counter()
            for b in range(B):
                self.n[b] += 1
                self.pending[b] = nxt[b]
                self._emit(b, [nxt[b]], now)
            if self.profile:
                self.stats.append(StepStats("decode", B, 1, n_mean, t1 - t0, now - t0, B))
            return

        S, N = self.shape.steps, self.shape.num_draft_tokens
        tree = self._propose(n, n_max, B)
        self._sync()
        t1 = time.perf_counter()
        slots = n[:, None] + torch.arange(N, device=dev)
        pos = n[:, None] + tree.depth
        logits, aux = self._target(0, tree.tokens, pos, n, slots, tree.ancestors, n_max + N, False)
        verdict = verify(tree, logits, rows, S)
        path, acc, nxt = verdict.path, verdict.accepted, verdict.next_token
        # accepted path -> committed slots n..n+a (a chain's path is already there)
        last = path.gather(1, acc[:, None])
        filled = torch.where(path >= 0, path, last)
        if not self.shape.is_chain:
            keep_dst = torch.arange(S + 1, device=dev)[None].minimum(acc[:, None])
            self.tcache.keep(0, n[:, None] + filled, n[:, None] + keep_dst)
        toks = tree.tokens.gather(1, filled)  # (B, S+1): path tokens (root first)
        host_acc, host_toks, host_nxt = acc.tolist(), toks.tolist(), nxt.tolist()
        t2 = time.perf_counter()
        emitted = 0
        for b in range(B):
            a = host_acc[b]
            before = len(self.rows[b].tokens)
            self._emit(b, host_toks[b][1 : a + 1] + [host_nxt[b]], t2, accepted=a)
            emitted += len(self.rows[b].tokens) - before
        # 5. the draft's step 0 on each row's accepted path, left padded to the longest
        lens = acc + 1
        q = max(host_acc) + 1
        j = torch.arange(q, device=dev)[None] - (q - lens)[:, None]  # index along the path (< 0: padding)
        jc = j.clamp(min=0)
        nxt_tok = torch.where(jc < acc[:, None], toks.gather(1, (jc + 1).clamp(max=S)), nxt[:, None])
        node = filled.gather(1, jc)  # tree node whose aux state pairs with nxt_tok
        hidden = self.draft.fuse(aux.gather(1, node[:, :, None].expand(-1, -1, aux.shape[-1])))
        dpos = n[:, None] + jc
        write = M.left_padded_slots(n, lens, q)
        h, dl = self._commit(
            0, nxt_tok, hidden, dpos, n, write, dpos, M.causal_vis(lens, q), n_max + q, last_only=True
        )
        if dl is not None:
            self.head_logits[:B] = dl[:, -1].float()
            self.head_state[:B] = h[:, -1]
        self.pending[:B] = nxt
        for b in range(B):
            self.n[b] += host_acc[b] + 1
        self._sync()
        now = time.perf_counter()
        if self.profile:
            self.stats.append(StepStats("decode", B, N, n_mean, t2 - t1, now - t0, emitted))

    def _propose(self, n: torch.Tensor, n_max: int, B: int):
        """Step 2: the draft kind's proposal for rows 0..B-1 (n: their committed entries) -> a Tree."""
        return self._proposal(self, n, n_max, B)

    def _commit(self, *args, last_only: bool):
        """What the draft keeps of committed positions (row0, ids, hidden, pos, committed, write, spec_pos,
        vis, kv_len): (its output state, its logits), where it drafts from next."""
        return self._commit_fn(self, *args, last_only=last_only)

    # ------------------------------------------------------------------ bookkeeping

    def _sampling(self, lo: int, hi: int) -> RowSampling:
        return RowSampling.of([r.params for r in self.rows[lo:hi]], self.gens[lo:hi], self.vocab, self.device)

    def _sync(self) -> None:
        if self.profile and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _emit(self, b: int, tokens: list[int], now: float, accepted: int | None = None) -> None:
        """Append tokens to row b's request, cut at eos / stop ids / max_tokens. `accepted`: the drafts
        a verification accepted (None for a prefill or a plain decoding step: no verification)."""
        r = self.rows[b]
        if r.finished:
            return
        p = r.params
        out = []
        for t in tokens:
            out.append(t)
            if (t in self.eos_ids and not p.ignore_eos) or t in p.stop_token_ids:
                r.finish_reason = "stop"
                break
            if (
                len(r.tokens) + len(out) >= p.max_tokens
                or len(r.prompt) + len(r.tokens) + len(out) >= self.max_model_len
            ):
                r.finish_reason = "length"
                break
        r.tokens.extend(out)
        r.token_times.extend([now] * len(out))
        if accepted is not None:
            r.emitted.append(len(out))
            r.accepted.append(accepted)  # vLLM's count: drafts a stop cut off are still accepted
        if r.on_tokens is not None:
            r.on_tokens(r, out)

    def _finish(self, b: int, reason: str) -> None:
        r = self.rows[b]
        if not r.finished:
            r.finish_reason = reason
            if r.on_tokens is not None:
                r.on_tokens(r, [])

    def abort(self, req: Request) -> None:
        """Stop a request (a client went away): it leaves at the next retire."""
        self.waiting = deque(r for r in self.waiting if r is not req)
        req.finish_reason = req.finish_reason or "abort"

    def retire(self) -> None:
        """Finished rows leave; the last row takes each one's place."""
        b = 0
        while b < len(self.rows):
            if not self.rows[b].finished:
                b += 1
                continue
            last = len(self.rows) - 1
            self.tcache.move_row(last, b)
            if self.draft is not None:
                self.dcache.move_row(last, b)
                self.head_logits[b] = self.head_logits[last]
                self.head_state[b] = self.head_state[last]
            self.pending[b] = self.pending[last]
            for lst in (self.rows, self.n, self.gens):
                lst[b] = lst[last]
                lst.pop()
