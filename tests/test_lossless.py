"""Speculative greedy output == plain greedy output, on several random tiny gpt-oss targets,
k = 1..6, prompts longer than the sliding window, with proposers right 0%..100% of the time."""

import random

import pytest
import torch

from eyas.serve.speculative import DraftRunner, greedy_generate, speculative_generate
from eyas.train.model import DraftConfig, Eagle3Draft

from data_fixtures import one_thread  # noqa: F401  (tiny models: one thread is faster)
from tiny_targets import tiny_gpt_oss

pytestmark = pytest.mark.usefixtures("one_thread")


def draft_for(target, seed):
    tc = target.config
    torch.manual_seed(seed)
    cfg = DraftConfig.from_target_config(tc, [0, 2, tc.num_hidden_layers - 1], draft_vocab_size=tc.vocab_size // 2)
    d = Eagle3Draft(cfg)
    d.embed_tokens.weight.data.copy_(target.get_input_embeddings().weight)
    ids = torch.arange(cfg.draft_vocab_size) * 2  # every other target id
    d2t = ids - torch.arange(cfg.draft_vocab_size)
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    d.set_vocab_map(d2t, t2d)
    return d.eval()


class NoisyOracle(DraftRunner):
    """Proposes the target's true greedy continuation, wrong with probability `p_wrong`."""

    def __init__(self, draft, full, p_wrong, seed):
        super().__init__(draft)
        self.full, self.p, self.rng = full, p_wrong, random.Random(seed)

    def _guess(self, index):
        true = self.full[index] if index < len(self.full) else 5
        return (true + 1) % 128 if self.rng.random() < self.p else true

    def prefill(self, tokens, aux, start):
        super().prefill(tokens, aux, start)  # keep the real cache bookkeeping
        return self._guess(start + len(tokens) + 1), torch.zeros(1, 1, self.draft.config.hidden_size)

    def chain(self, token, hidden, position):
        super().chain(token, hidden, position)
        return self._guess(position + 2), hidden


CASES = [  # (seed, target size kwargs)
    (0, dict(layers=4, hidden=64, window=8)),
    (1, dict(layers=3, hidden=32, window=5, heads=2, kv=1)),
    (2, dict(layers=6, hidden=48, window=16, heads=4, kv=4, head_dim=12)),
]


@pytest.mark.parametrize("seed,size", CASES)
def test_speculative_equals_greedy(seed, size):
    target = tiny_gpt_oss(seed=seed, **size)
    draft = draft_for(target, seed)
    rng = random.Random(seed)
    window = target.config.sliding_window
    for trial, k in enumerate(range(1, 7)):
        prompt = [rng.randrange(2, 128) for _ in range(window * 2 + trial)]  # longer than the window
        ref, _, _ = greedy_generate(target, prompt, max_new_tokens=24, eos_ids=None)
        assert len(ref) == 24
        out = speculative_generate(target, draft, prompt, k=k, max_new_tokens=24)
        assert out.tokens == ref, f"k={k}: random draft diverged"
        full = prompt + ref
        runs = {}
        for p_wrong in (0.0, 0.4):
            runner = NoisyOracle(draft, full, p_wrong, seed=trial)
            runs[p_wrong] = speculative_generate(target, draft, prompt, k=k, max_new_tokens=24, runner=runner)
            assert runs[p_wrong].tokens == ref[:24], f"k={k} p_wrong={p_wrong}: speculative output diverged"
        # a perfect proposer gets every draft accepted (but past the reference's end) ...
        assert all(a == k for a in runs[0.0].accepted[:-1])
        # ... and a noisy one sees partial acceptances, exercising every rollback length
        assert runs[0.4].target_forwards < 24


def test_eos_stops_both():
    target = tiny_gpt_oss(seed=4)
    draft = draft_for(target, 4)
    prompt = list(range(2, 30))
    ref, _, _ = greedy_generate(target, prompt, max_new_tokens=30)
    eos = {ref[7]}  # pretend the 8th greedy token is eos
    ref_eos, _, _ = greedy_generate(target, prompt, max_new_tokens=30, eos_ids=eos)
    assert ref_eos == ref[:ref.index(ref[7]) + 1]
    runner = NoisyOracle(draft, prompt + ref, 0.0, seed=0)
    out = speculative_generate(target, draft, prompt, k=4, max_new_tokens=30, eos_ids=eos, runner=runner)
    assert out.tokens == ref_eos
