"""``otel-guard report --chart``: stop reasons over time (stacked bars) and cost by outcome.

Lives in the store package because it only draws a :class:`Report`; matplotlib (server
extra) is imported lazily with the Agg backend so it works headless.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["draw_chart"]


def draw_chart(report: Any, path: str | Path, *, bucket_s: int = 60) -> Path:
    """Write a PNG with two panels: runs per bucket stacked by status/reason, cost by outcome."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    buckets = sorted({p["bucket_start_unix"] for p in report.series})
    keys = sorted({(p["status"], p["reason"]) for p in report.series})
    counts: dict[tuple[str, str], dict[float, int]] = defaultdict(dict)
    for p in report.series:
        counts[(p["status"], p["reason"])][p["bucket_start_unix"]] = p["runs"]

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [2.2, 1]})
    xs = [datetime.fromtimestamp(b, UTC) for b in buckets]
    width = bucket_s / 86400 * 0.85  # matplotlib date units are days
    bottom = [0] * len(buckets)
    cmap = plt.get_cmap("tab20")
    for i, key in enumerate(keys):
        ys = [counts[key].get(b, 0) for b in buckets]
        ax1.bar(
            xs,
            ys,
            width=width,
            bottom=bottom,
            align="edge",
            label=f"{key[0]}/{key[1]}",
            color=cmap(i % 20),
        )
        bottom = [a + b for a, b in zip(bottom, ys, strict=True)]
    ax1.set_title("Stop reasons over time (runs per bucket)")
    ax1.set_ylabel("runs")
    ax1.xaxis_date()
    fig.autofmt_xdate()
    if keys:
        ax1.legend(fontsize=7, loc="upper left", ncols=2)
    else:
        ax1.text(0.5, 0.5, "no runs", ha="center", va="center", transform=ax1.transAxes)

    by_outcome = sorted(
        ((r["cost_usd"] or 0.0, f"{r['status']}/{r['reason']}") for r in report.rows),
        reverse=True,
    )
    ax2.barh([k for _, k in by_outcome], [c for c, _ in by_outcome], color="#d62728")
    ax2.invert_yaxis()
    ax2.set_title("Cost by outcome (USD)")
    ax2.set_xlabel("USD")
    ax2.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
