"""The report's plots readable at a glance: the recipe's 6 shapes (k = 1..5 and a tree) at T = 0 and 1 are
12 acceptance lines, each its own colour (the default cycle has 10), temperature by line style, integer
draft positions; the throughput panels' concurrency ticks are the levels run."""

import pytest

from eyas.eval import plots


def rows(shapes, temps, levels):
    out = []
    for k in shapes:
        for t in temps:
            for c in levels:
                out.append(
                    {
                        "benchmark": "gsm8k",
                        "draft": "eyas",
                        "engine": "eyas",
                        "k": None if k == "tree" else k,
                        "tree": [5, 4, 8] if k == "tree" else None,
                        "temperature": t,
                        "concurrency": c,
                        "per_position_acceptance": [0.8, 0.6, 0.4, 0.3, 0.2][: 5 if k == "tree" else k],
                        "acceptance_length": 2.0,
                        "output_tokens_per_s": 100.0 * c,
                        "baseline_output_tokens_per_s": 80.0 * c,
                    }
                )
    return out


@pytest.fixture
def figures(monkeypatch):
    seen = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: seen.append(fig) or path)
    return seen


def test_acceptance_lines_have_their_own_colours_and_temperature_styles(figures, tmp_path):
    plots.acceptance_plot(rows([1, 2, 3, 4, 5, "tree"], [0.0, 1.0], [1, 16]), tmp_path / "a.png", "gsm8k")
    (ax,) = figures[0].axes
    lines = ax.get_lines()
    assert len(lines) == 12 and len({tuple(line.get_color()) for line in lines}) == 12
    styles = {line.get_label().rsplit("T=", 1)[1].split(" ")[0]: line.get_linestyle() for line in lines}
    assert styles == {"0": "-", "1": "--"}
    assert all(float(t).is_integer() for t in ax.get_xticks() if 1 <= t <= 5)


def test_throughput_ticks_are_the_concurrency_levels(figures, tmp_path):
    plots.throughput_plot(rows([1, 3], [0.0], [1, 4, 16, 64]), tmp_path / "t.png", "gsm8k")
    (ax,) = figures[0].axes
    assert list(ax.get_xticks()) == [1, 4, 16, 64]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "4", "16", "64"]
    speculative = [line for line in ax.get_lines() if line.get_label() != "no speculation"]
    assert len({tuple(line.get_color()) for line in speculative}) == 2
