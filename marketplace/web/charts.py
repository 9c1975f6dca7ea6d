"""Small SVG charts shared by the storefront and the provider portal, drawn server-side (no script needed)."""

from __future__ import annotations

from typing import Any


def sparkline(series: list[tuple[Any, Any]], width: int = 160, height: int = 32) -> str:
    """SVG polyline points for percentages (0-100), oldest left; "" for no data."""
    if not series:
        return ""
    if len(series) == 1:
        series = series * 2  # one sample: a level line across the chart
    step = width / (len(series) - 1)
    return " ".join(f"{i * step:.1f},{height - float(v) / 100 * height:.1f}" for i, (_, v) in enumerate(series))
