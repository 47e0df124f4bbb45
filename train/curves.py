"""RUN/train/curves.png from RUN/train/log.jsonl: loss, per-step accuracy and simulated tau over
training (matplotlib), training batches as logged and validation where it ran."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def plot_curves(log_path: Path, png: Path) -> Path | None:
    if not Path(log_path).is_file():
        return None
    entries = [json.loads(line) for line in Path(log_path).read_text().splitlines() if line.strip()]
    train = [e for e in entries if "loss" in e]
    val = [e for e in entries if "val" in e]
    if not train and not val:
        return None
    fig, (ax_loss, ax_acc, ax_tau) = plt.subplots(1, 3, figsize=(16, 4.2))
    if train:
        steps = [e["step"] for e in train]
        ax_loss.plot(steps, [e["loss"] for e in train], label="train (batch)")
        for j in range(len(train[-1]["acc"])):
            ax_acc.plot(steps, [e["acc"][j] if j < len(e["acc"]) else None for e in train], label=f"step {j}")
        ax_tau.plot(
            steps,
            [e["simulated_acceptance"] for e in train],
            "k--",
            label=f"train, k={len(train[-1]['acc'])}",
        )
    if val:
        vsteps = [e["step"] for e in val]
        ax_loss.plot(vsteps, [e["val"]["loss"] for e in val], "o-", label="validation")
        for k in range(1, len(val[-1]["val"]["simulated_tau"]) + 1):
            ax_tau.plot(
                vsteps, [e["val"]["simulated_tau"][k - 1] for e in val], "o-", label=f"validation, k={k}"
            )
        if val[-1]["val"].get("simulated_tau_t1"):  # T = 1, the longest chain (train/validation.py)
            k = len(val[-1]["val"]["simulated_tau_t1"])
            t1 = [e["val"].get("simulated_tau_t1", [None] * k)[k - 1] for e in val]
            ax_tau.plot(vsteps, t1, "s:", label=f"validation, T=1, k={k}")
    ax_loss.set(title="TTT loss", xlabel="optimizer step")
    ax_acc.set(title="top-1 accuracy per TTT step (train)", xlabel="optimizer step", ylim=(0, 1))
    ax_tau.set(title="simulated τ (chain of k drafts; greedy unless T=1)", xlabel="optimizer step")
    for ax in (ax_loss, ax_acc, ax_tau):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png
