"""The report's figures (matplotlib, PNG): output throughput vs concurrency, one line per draft
shape (k or tree) and one for plain decoding, a panel per temperature; and per-position
acceptance, one line per draft shape and temperature."""

from __future__ import annotations

from pathlib import Path

import matplotlib

from eyas.eval.report import shape_label

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def _label(r: dict) -> str:
    engine = f" ({r['engine']})" if r.get("engine", "eyas") != "eyas" else ""
    return f"{r['draft']} {shape_label(r)}{engine}"


def throughput_plot(results: list[dict], path: Path, benchmark: str) -> Path:
    rows = [r for r in results if r["benchmark"] == benchmark]
    temps = sorted({r["temperature"] for r in rows})
    fig, axes = plt.subplots(1, len(temps), figsize=(5.5 * len(temps), 4.2), squeeze=False)
    for ax, temp in zip(axes[0], temps):
        sub = [r for r in rows if r["temperature"] == temp]
        lines: dict[str, list] = {}
        base: dict[int, float] = {}
        for r in sub:
            lines.setdefault(_label(r), []).append((r["concurrency"], r["output_tokens_per_s"]))
            if r.get("baseline_output_tokens_per_s"):
                base[r["concurrency"]] = r["baseline_output_tokens_per_s"]
        for label, pts in sorted(lines.items()):
            pts.sort()
            ax.plot([c for c, _ in pts], [t for _, t in pts], marker="o", label=label)
        if base:
            cs = sorted(base)
            ax.plot(
                cs, [base[c] for c in cs], marker="s", color="black", linestyle="--", label="no speculation"
            )
        ax.set_xscale("log", base=2)
        _axes(ax, "concurrent requests", "output tokens/s", f"{benchmark}, temperature {temp:g}")
    return _save(fig, path)


def _axes(ax, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def acceptance_plot(results: list[dict], path: Path, benchmark: str) -> Path:
    rows = [r for r in results if r["benchmark"] == benchmark and r.get("per_position_acceptance")]
    fig, ax = plt.subplots(figsize=(6, 4.2))
    seen = set()
    for r in sorted(rows, key=lambda r: r["concurrency"]):
        key = (_label(r), r["temperature"])
        if key in seen:  # acceptance does not depend on concurrency: the lowest level's run
            continue
        seen.add(key)
        pp = r["per_position_acceptance"]
        ax.plot(
            range(1, len(pp) + 1),
            pp,
            marker="o",
            label=f"{key[0]}, T={key[1]:g} (τ={r['acceptance_length']:.2f})",
        )
    ax.set_ylim(0, 1.02)
    _axes(ax, "draft position", "acceptance rate", f"{benchmark}: per-position acceptance")
    return _save(fig, path)
