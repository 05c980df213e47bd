"""The chart ``python -m bench.spark --chart PATH`` writes (PNG, matplotlib's Agg backend).

Left: rows/s of each contender on one workload (best round), longest bar first.
Right: throughput against ``capacity`` for the library and the hand-written
version, beside the ceiling ``capacity x partitions / mean latency``. Needs the
``bench`` extra (``pip install -e ".[bench]"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def write_chart(
    path: Path,
    title: str,
    contenders: Mapping[str, float],
    sweep: Mapping[str, Sequence[tuple[int, float]]],
    ceiling_per_slot: float,
) -> None:
    """``contenders``: label -> rows/s; ``sweep``: label -> [(capacity, rows/s)];
    ``ceiling_per_slot``: rows/s per unit of capacity at the bound (partitions / latency)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, lines) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=110)
    ranked = sorted(contenders.items(), key=lambda kv: kv[1])
    labels = [label for label, _ in ranked]
    rates = [rate for _, rate in ranked]
    drawn = bars.barh(labels, rates, color="#4878a8")
    bars.bar_label(drawn, labels=[f"{r:,.0f}" for r in rates], padding=3, fontsize=8)
    bars.set_xlabel("rows/s (best round)")
    bars.set_xlim(0, max(rates) * 1.25)
    bars.set_title("contenders, 20 ms log-normal lookup", fontsize=10)

    capacities = sorted({c for points in sweep.values() for c, _ in points})
    lines.plot(capacities, [c * ceiling_per_slot for c in capacities], "k--", linewidth=1,
               label="ceiling: capacity x partitions / latency")  # fmt: skip
    for label, points in sweep.items():
        xs, ys = zip(*sorted(points), strict=True)
        lines.plot(xs, ys, marker="o", label=label)
    lines.set_xscale("log", base=2)
    lines.set_yscale("log")
    lines.set_xticks(capacities, [str(c) for c in capacities])
    lines.set_xlabel("capacity (lookups in flight per partition)")
    lines.set_ylabel("rows/s")
    lines.set_title("throughput against capacity, 20 ms lookup", fontsize=10)
    lines.legend(fontsize=8)
    lines.grid(True, which="both", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
