"""Inline SVG charts: drawn on the server, no script or external asset needed."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from markupsafe import Markup, escape

PALETTE = ("#2f6fde", "#d9485f", "#e8a317", "#2a9d6e", "#8856d6", "#5f6b7a")


def _nice(v: float) -> float:
    if v <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * exp:
            return float(m * exp)
    return float(10 * exp)  # pragma: no cover


def _fmt(v: float) -> str:
    if v >= 1000:
        return f"{v / 1000:g}k"
    return f"{v:g}"


def line_chart(
    title: str,
    minutes: Sequence[int],
    lines: Sequence[tuple[str, Sequence[float | None]]],
    *,
    unit: str = "",
    width: int = 560,
    height: int = 190,
) -> Markup:
    """A line chart over the given minutes (one point a minute; None is a gap)."""
    left, right, top, bottom = 52, 10, 38, 22
    w, h = width - left - right, height - top - bottom
    values = [v for _, vs in lines for v in vs if v is not None]
    top_v = _nice(max(values) if values else 0.0)
    n = max(1, len(minutes) - 1)

    def x(i: int) -> float:
        return left + w * i / n

    def y(v: float) -> float:
        return top + h - h * (v / top_v)

    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        f'<text x="8" y="13" class="chart-title">{escape(title)}</text>',
    ]
    for frac in (0.0, 0.5, 1.0):
        gy = top + h - h * frac
        parts.append(
            f'<line x1="{left}" x2="{left + w}" y1="{gy:.1f}" y2="{gy:.1f}" class="grid"/>'
        )
        label = escape(_fmt(top_v * frac) + unit)
        parts.append(
            f'<text x="{left - 4}" y="{gy + 4:.1f}" class="axis" text-anchor="end">{label}</text>'
        )
    if minutes:
        now_m = int(time.time() // 60)
        for i in (0, len(minutes) // 2, len(minutes) - 1):
            ago = now_m - minutes[i]
            when = "now" if ago <= 0 else f"-{ago}m"
            parts.append(
                f'<text x="{x(i):.1f}" y="{height - 6}" class="axis" '
                f'text-anchor="middle">{when}</text>'
            )
    for k, (name, vs) in enumerate(lines):
        color = PALETTE[k % len(PALETTE)]
        runs: list[list[str]] = [[]]
        for i, v in enumerate(vs):
            if v is None:
                runs.append([])
            else:
                runs[-1].append(f"{x(i):.1f},{y(v):.1f}")
        for run in runs:
            if len(run) == 1:
                cx, cy = run[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{color}"/>')
            elif run:
                points = " ".join(run)
                parts.append(
                    f'<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{points}"/>'
                )
        lx = left + k * 100
        parts.append(f'<rect x="{lx}" y="20" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{lx + 14}" y="29" class="legend">{escape(name)}</text>')
    if not values:
        parts.append(
            f'<text x="{left + w / 2}" y="{top + h / 2}" class="axis" text-anchor="middle">'
            "no jobs in the last hour</text>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))
