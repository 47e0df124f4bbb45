"""Validation that predicts serving: TTT metrics on captured sequences held out from training.

A seeded slice of the captured sequences (`train.val_fraction`) is never trained on. Every
`train.val_every` optimizer steps and at the end, the draft runs TTT over all of it (no grad) and
the counts are summed over every batch and every process before dividing:

    acc_j       top-1 agreement with the target at step j, over loss-masked positions
    cond_acc_j  the same among positions where steps 0..j-1 were all right
    tau_k       1 + sum_{j<k} prod_{i<=j} cond_acc_i, k = 1..ttt_steps: the acceptance length a greedy
                chain of k drafts would get (bonus token included), which `eyas eval` sets next to
                the serving loop's measured tau at the same k.
    sampled_cond_acc_j, tau_t1_k   the same at temperature 1: the draft's argmax accepted with the
                target's probability, chains weighted by the probability of reaching step j along the
                captured tokens (train/ttt.py); `eyas eval` sets it next to the loop's tau at T = 1.
    replayed_tau_k  the greedy loop's own rounds along the captured text: the first chain where the
                answer starts, the next after its accepted drafts and bonus token, and so on; tau_k = 1 +
                accepted / rounds, vLLM's count. tau_k above starts a chain at every position, most of them
                inside runs the loop accepts whole; this counts the positions the loop drafts from, so on
                the target's own greedy text it is the greedy loop's tau (`replay`): a draft counts where it
                is the captured token itself, as the loop accepts it when this text is its target's output.
                On text sampled at T = 1 that is a loop verifying against the sampled tokens, not the
                greedy loop's tau.
"""

from __future__ import annotations

import torch

from .ttt import STEP_ROWS, model_inputs, simulated_tau

# the counts summed per step, by name: TTT's (train/ttt.py STEP_ROWS, but its loss) and the replayed rounds'
ROWS = (*STEP_ROWS[1:], "accepted", "rounds")


def sampled_at_t1(data) -> bool:
    """Whether the recipe's answers (`data` section) are the target's own samples at temperature 1,
    untruncated: then training's T = 1 estimate follows them without weighting (train/ttt.py)."""
    return float(data.temperature) == 1.0 and float(data.top_p) == 1.0


@torch.no_grad()
def validate(module, batches, accelerator, ttt_steps: int, sp=None) -> dict:
    """Sum TTT counts over `batches` (this process's share) and over processes -> metrics dict. Under
    sequence parallelism (`sp`) each process of a group holds its rows' whole counts: the first adds them."""
    counts = torch.zeros(len(ROWS), ttt_steps, dtype=torch.float64, device=accelerator.device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=accelerator.device)
    n_batches = 0
    was_training = module.training
    module.eval()
    for batch in batches:
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        out = module(**model_inputs(batch))
        if int(batch["lengths"].sum()) == 0 or (sp is not None and sp.rank):
            continue  # an empty filler batch (train/schedule.py): it ran only to keep processes in step
        accepted, rounds = replay(out.run_length, batch["loss_mask"], batch["doc_ids"], ttt_steps)
        rows = {
            "counted": out.step_count,
            "right": out.step_right,
            "cond_base": out.step_cond_base,
            "cond_right": out.step_cond_right,
            "sampled_base": out.step_sampled_base,
            "sampled_right": out.step_sampled_right,
            "accepted": accepted,
            "rounds": rounds,
        }
        counts += torch.tensor([rows[name] for name in ROWS], dtype=torch.float64, device=counts.device)
        loss_sum += out.loss_value
        n_batches += 1
    module.train(was_training)
    counts = accelerator.reduce(counts, reduction="sum")
    totals = accelerator.reduce(
        torch.stack([loss_sum, torch.tensor(float(n_batches), dtype=torch.float64, device=counts.device)]),
        reduction="sum",
    )
    c = dict(zip(ROWS, counts.tolist(), strict=True))  # each row: per step
    acc = [r / max(n, 1) for r, n in zip(c["right"], c["counted"])]
    cond_acc = [r / max(b, 1) for r, b in zip(c["cond_right"], c["cond_base"])]
    sampled = [r / b if b > 0 else 0.0 for r, b in zip(c["sampled_right"], c["sampled_base"])]
    accepted, rounds = c["accepted"], c["rounds"]
    return {
        "loss": totals[0].item() / max(totals[1].item(), 1),
        "positions": int(c["counted"][0]),
        "acc": acc,
        "cond_acc": cond_acc,
        "simulated_tau": simulated_tau(cond_acc),
        "sampled_cond_acc": sampled,
        "simulated_tau_t1": simulated_tau(sampled),
        "replayed_tau": [1 + a / max(r, 1) for a, r in zip(accepted, rounds)],
    }


def replay(run_length: torch.Tensor, loss_mask: torch.Tensor, doc_ids: torch.Tensor, ttt_steps: int):
    """The greedy serving loop's rounds along each answer of a batch, for chains of k = 1..ttt_steps drafts.

    run_length (B, T) from train/ttt.py: the chain drafted at index i (after the verified prefix
    x_0..x_{i+1}) has its first run_length[i] drafts equal to the text's tokens. An answer is a span [a, b)
    of loss-masked positions of one sequence: the prefill gives x_a, the first chain is at i = a - 1, and a
    round that accepts m drafts (m = min(run_length[i], k), cut at the answer's end) adds its bonus token,
    so the next chain is at i + m + 1 -> (accepted drafts per k, rounds per k), summed over the batch."""
    accepted, rounds = [0] * ttt_steps, [0] * ttt_steps
    for row, mask, docs in zip(run_length.tolist(), loss_mask.tolist(), doc_ids.tolist()):
        for a, b in answer_spans(mask, docs):
            for k in range(1, ttt_steps + 1):
                i = a - 1
                while b - 2 - i > 0:  # a token after the verified prefix is left to draft
                    m = min(row[i], k, b - 2 - i)
                    accepted[k - 1] += m
                    rounds[k - 1] += 1
                    i += m + 1
    return accepted, rounds


def answer_spans(mask: list, docs: list) -> list[tuple[int, int]]:
    """Maximal runs [a, b) of positions with mask 1 inside one sequence (docs: its id per position) whose
    position a - 1 is in the same sequence."""
    spans, a = [], None
    for t, (m, d) in enumerate(zip(mask, docs)):
        if a is not None and (not m or d != docs[a]):
            spans.append((a, t))
            a = None
        if m and a is None and t >= 1 and docs[t - 1] == d:  # its chain starts at t - 1, in its own sequence
            a = t
    return spans + ([(a, len(mask))] if a is not None else [])
