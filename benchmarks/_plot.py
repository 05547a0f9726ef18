"""The bar chart the benchmarks with a plot share: per group, one bar per implementation, each
labelled with its speedup."""

from __future__ import annotations

from typing import Any


def speedup_bars(
    ax: Any,
    groups: list[dict],
    names: list[str],
    labels: list[str],
    scale: float = 1.0,
    label_size: int = 8,
    tick_size: int | None = None,
) -> float:
    """Draws ``groups[g]["implementations"][name]["us_per_request"] / scale`` as bars (one colour
    per name), labels each with its ``speedup`` and each group with ``labels[g]``; returns the
    bar width."""
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        results = [group["implementations"][name] for group in groups]
        values = [result["us_per_request"] / scale for result in results]
        bars = ax.bar([x + i * width for x in range(len(groups))], values, width, label=name)
        for bar, result in zip(bars, results):
            ax.annotate(
                f"{result['speedup']:.1f}x",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=label_size,
            )
    centers = [x + width * (len(names) - 1) / 2 for x in range(len(groups))]
    ax.set_xticks(centers, labels, **({} if tick_size is None else {"fontsize": tick_size}))
    return width
