"""The report's figures (matplotlib, PNG): output throughput vs concurrency, one line per draft
shape (k or tree) and one for plain decoding, a panel per temperature; and per-position
acceptance, one line per draft shape and temperature.

Readable at a glance: no two lines of a figure share a colour (`palette`: tab10, tab20, then evenly
spaced turbo colours), temperature is the line style (solid for the first, dashed, dotted, ...), and the
axes that count (draft positions, concurrency levels) carry integer ticks only."""

from __future__ import annotations

from pathlib import Path

import matplotlib

from eyas.eval.report import shape_label

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator, ScalarFormatter  # noqa: E402

STYLES = ("-", "--", ":", "-.")  # one per temperature, in order


def palette(n: int) -> list:
    """n distinct colours: matplotlib's tab10 up to 10, tab20 up to 20, else n evenly spaced turbo colours."""
    if n <= 10:
        return [plt.get_cmap("tab10")(i) for i in range(n)]
    if n <= 20:
        return [plt.get_cmap("tab20")(i) for i in range(n)]
    return [plt.get_cmap("turbo")(i / (n - 1)) for i in range(n)]


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
        for (label, pts), colour in zip(sorted(lines.items()), palette(len(lines))):
            pts.sort()
            ax.plot([c for c, _ in pts], [t for _, t in pts], marker="o", color=colour, label=label)
        if base:
            cs = sorted(base)
            ax.plot(
                cs, [base[c] for c in cs], marker="s", color="black", linestyle="--", label="no speculation"
            )
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(sorted({r["concurrency"] for r in sub})))  # the levels run
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_locator(NullLocator())
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
    """Per-position acceptance: a line per (draft shape, temperature), each its own colour, temperature
    also by line style; a run at the lowest concurrency stands for its shape (acceptance does not depend
    on concurrency)."""
    rows = [r for r in results if r["benchmark"] == benchmark and r.get("per_position_acceptance")]
    lines: dict[tuple[str, float], dict] = {}
    for r in sorted(rows, key=lambda r: r["concurrency"]):
        lines.setdefault((_label(r), r["temperature"]), r)
    temps = sorted({t for _, t in lines})
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for ((label, temp), r), colour in zip(sorted(lines.items()), palette(len(lines))):
        pp = r["per_position_acceptance"]
        ax.plot(
            range(1, len(pp) + 1),
            pp,
            marker="o",
            color=colour,
            linestyle=STYLES[temps.index(temp) % len(STYLES)],
            label=f"{label}, T={temp:g} (τ={r['acceptance_length']:.2f})",
        )
    ax.set_ylim(0, 1.02)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _axes(ax, "draft position", "acceptance rate", f"{benchmark}: per-position acceptance")
    return _save(fig, path)
