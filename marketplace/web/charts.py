"""Charts shared by the storefront and the provider portal, drawn on the server by matplotlib as inline SVG, so
pages need no script to show them.

Every chart is an ``<svg class="chart" role="img">`` labelled by its own ``<title>`` and ``<desc>`` (what a
screen reader reads), scales to its container (``width="100%"`` and a ``viewBox``, no fixed pixel size), uses
the site's sans-serif at 12 px and carries no ``<style>`` element (matplotlib's one would apply to the whole
page). Wide charts come twice, a wide and a narrow drawing; the stylesheet shows the one that fits the screen.

Strings from outside (zone names come from providers) are only ever drawn as text: mathtext is off, and the SVG
is serialized by ElementTree, which escapes them.

matplotlib is imported when the first chart is drawn, not with this module: every process that loads the URLs
(workers, beat, the ledger sequencer) would otherwise carry it, about 45 MB each and a second of start-up.
"""

from __future__ import annotations

import datetime as dt
import io
import re
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from itertools import count
from typing import TYPE_CHECKING, Any

from django.utils.safestring import SafeString, mark_safe

from marketplace.catalog.history import Series

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

SVG_NS = "http://www.w3.org/2000/svg"
XLINK_NS = "http://www.w3.org/1999/xlink"
ET.register_namespace("", SVG_NS)
ET.register_namespace("xlink", XLINK_NS)

FONT = 'system-ui, -apple-system, "Segoe UI", sans-serif'  # broker.css' body font
INK, MUTED, GRID = "#1d2330", "#4b5363", "#e3e6ec"
# Distinct hues, each at least 4.5:1 against white, so a line reads as well as the text beside it.
PALETTE = ["#2456d6", "#a65200", "#17804a", "#8e3bb8", "#c23b3b", "#0e6f86", "#6b4f2a", "#4b5563"]
ACCENT, IDLE = PALETTE[0], "#6b7385"
LABEL_CHARS = 40  # a provider's zone name longer than this is cut in the legend (the title keeps it whole)

RC: dict[str, Any] = {
    "svg.fonttype": "none",  # text stays text: searchable, selectable, drawn in the page's own font
    "text.parse_math": False,  # a "$" in a zone name is a dollar, not the start of a formula
    "font.family": "sans-serif",
    "font.size": 12,
    "axes.edgecolor": MUTED,
    "axes.labelcolor": INK,
    "axes.titlesize": 12,
    "axes.titleweight": "bold",
    "xtick.color": MUTED,
    "ytick.color": MUTED,
    "xtick.labelcolor": INK,
    "ytick.labelcolor": INK,
    "xtick.labelsize": 12,
    "ytick.labelsize": 12,
    "legend.fontsize": 12,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
# rcParams are process-wide and read both when a figure is made and when it is saved: one chart at a time holds
# them (a chart takes tens of milliseconds), so concurrent requests never see each other's settings.
_RC_LOCK = threading.Lock()
_serial = count()


@dataclass(frozen=True)
class Hover:
    """A band of the plot (data coordinates, x from ``start`` to ``end`` at height ``value``) that shows
    ``text`` as a tooltip when the pointer is over it."""

    start: dt.datetime
    end: dt.datetime
    value: float
    text: str


def _render(
    draw: Callable[[Figure], tuple[Axes, list[Hover]]],
    *,
    size: tuple[float, float],
    title: str,
    desc: str,
    variant: str = "",
) -> str:
    """Draw a figure of ``size`` (points) with ``draw`` and return it as an inline ``<svg>`` string."""
    import matplotlib
    import matplotlib.dates as mdates
    from matplotlib.figure import Figure

    chart_id = f"chart-{next(_serial)}"
    # The salt makes matplotlib's clip-path and marker ids differ from chart to chart on one page.
    rc: Any = {**RC, "svg.hashsalt": chart_id}
    with _RC_LOCK, matplotlib.rc_context(rc):
        # 72 dpi: a display pixel is an SVG user unit, so hover bands land where the lines are.
        fig = Figure(figsize=(size[0] / 72, size[1] / 72), dpi=72, layout="constrained")
        ax, hovers = draw(fig)
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
        # After saving, the layout is final: place the hover bands in the SVG's coordinates (y grows downwards).
        bands = [
            (ax.transData.transform((mdates.date2num(h.start), h.value)),
             ax.transData.transform((mdates.date2num(h.end), h.value)), h.text)
            for h in hovers
        ]  # fmt: skip
    root = ET.fromstring(buffer.getvalue())  # noqa: S314 - matplotlib's own output, every outside string escaped
    for parent in root.iter():
        for child in list(parent):
            if child.tag in (f"{{{SVG_NS}}}metadata", f"{{{SVG_NS}}}style"):
                parent.remove(child)
    # matplotlib names every group ("figure_1", "axes_1"): the same names in each chart of a page. Only the ids
    # something points at (clip paths, marker shapes; unique per chart through svg.hashsalt) are kept.
    referenced = set(re.findall(r"#([\w.-]+)", buffer.getvalue()))
    for element in root.iter():
        if element.get("id") not in referenced:
            element.attrib.pop("id", None)
        style = element.get("style")
        if style and "font-family" in style:
            element.set("style", "; ".join(
                f"font-family: {FONT}" if part.strip().startswith("font-family") else part.strip()
                for part in style.split(";")
            ))  # fmt: skip
    height = size[1]
    root.attrib.pop("height", None)
    root.set("width", "100%")
    root.set("class", f"chart {variant}".strip())
    root.set("role", "img")
    root.set("aria-labelledby", f"{chart_id}-title {chart_id}-desc")
    root.set("stroke-linejoin", "round")  # what matplotlib's dropped <style> said, as inherited attributes
    root.set("stroke-linecap", "butt")
    title_el = ET.Element(f"{{{SVG_NS}}}title", id=f"{chart_id}-title")
    title_el.text = title
    desc_el = ET.Element(f"{{{SVG_NS}}}desc", id=f"{chart_id}-desc")
    desc_el.text = desc
    root.insert(0, desc_el)
    root.insert(0, title_el)
    if bands:
        group = ET.SubElement(root, f"{{{SVG_NS}}}g", {"class": "hover"})
        for (x0, y0), (x1, _), text in bands:
            rect = ET.SubElement(group, f"{{{SVG_NS}}}rect", {
                "x": f"{x0:.1f}", "y": f"{height - y0 - 6:.1f}", "width": f"{max(x1 - x0, 6):.1f}", "height": "12",
                "fill": "#000", "fill-opacity": "0",
            })  # fmt: skip
            tip = ET.SubElement(rect, f"{{{SVG_NS}}}title")
            tip.text = text
    return ET.tostring(root, encoding="unicode")


def _both(draw: Callable[[Figure, bool], tuple[Axes, list[Hover]]], *, wide: tuple[float, float],
          narrow: tuple[float, float], title: str, desc: str) -> SafeString:  # fmt: skip
    """The chart drawn wide and narrow; broker.css shows one (the other is display:none, hidden from readers too)."""
    return mark_safe(  # noqa: S308 - ElementTree serialized it, escaping every string
        _render(lambda fig: draw(fig, False), size=wide, title=title, desc=desc, variant="wide")
        + _render(lambda fig: draw(fig, True), size=narrow, title=title, desc=desc, variant="narrow")
    )


def _time_axis(ax: Axes, *, narrow: bool, since: dt.datetime, until: dt.datetime) -> None:
    """UTC time ticks with as much date as the span needs, and the axis labelled as such."""
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator(tz=dt.UTC, minticks=2, maxticks=4 if narrow else 8)
    ax.xaxis.set_major_locator(locator)
    # Ticks name the month with the day ("Dec 02", not a bare "02"); midnight among hour ticks shows the date.
    formats = ["%Y", "%b", "%b %d", "%H:%M", "%H:%M", "%H:%M:%S"]
    zero_formats = ["", "%Y", "%b %d", "%b %d", "%H:%M", "%H:%M"]
    ax.xaxis.set_major_formatter(
        mdates.ConciseDateFormatter(locator, tz=dt.UTC, formats=formats, zero_formats=zero_formats, show_offset=False)
    )
    ax.set_xlim(mdates.date2num(since), mdates.date2num(until))
    ax.set_xlabel("Time (UTC)")
    ax.grid(True, color=GRID, linewidth=0.8)
    ax.set_axisbelow(True)


def _stamp(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


PRICING_NAMES = {"on_demand": "on-demand", "spot": "spot"}


def price_chart(series: list[Series], *, instance_type: str, since: dt.datetime, until: dt.datetime) -> SafeString:
    """The price history of ``series`` (USD per hour) from ``since`` to ``until``: one step line per zone and
    pricing model (spot dashed, on-demand solid, one colour per zone), the price axis from 0, a legend, and a
    tooltip on every recorded price ("us-east-1a spot: $1.2345/h from 2026-12-01 14:00 UTC") over the span it
    held. "" when no series has a price."""
    drawn = [s for s in series if s.points]
    if not drawn:
        return mark_safe("")
    zones = sorted({s.zone for s in drawn})
    colour = {zone: PALETTE[i % len(PALETTE)] for i, zone in enumerate(zones)}
    top = max(price for s in drawn for _, price in s.points)

    def draw(fig: Figure, narrow: bool) -> tuple[Axes, list[Hover]]:
        import matplotlib.dates as mdates
        from matplotlib.ticker import MaxNLocator

        ax = fig.add_subplot()
        hovers = []
        for s in drawn:
            name = PRICING_NAMES.get(s.pricing_model, s.pricing_model)
            moments = [m for m, _ in s.points] + [until]  # the last price holds until now
            prices = [float(p) for _, p in s.points] + [float(s.points[-1][1])]
            label = f"{s.zone[:LABEL_CHARS]} {name}"
            at = mdates.date2num(moments)
            ax.step(at, prices, where="post", color=colour[s.zone], linewidth=2,
                    linestyle=(0, (5, 3)) if s.pricing_model == "spot" else "-", label=label)  # fmt: skip
            ax.plot(at[:-1], prices[:-1], linestyle="none", marker="o", markersize=4, color=colour[s.zone])
            for (moment, price), end in zip(s.points, moments[1:], strict=True):
                text = f"{s.zone} {name}: ${price:.4f}/h from {_stamp(moment)}"
                hovers.append(Hover(start=moment, end=end, value=float(price), text=text))
        _time_axis(ax, narrow=narrow, since=since, until=until)
        ax.set_ylim(0, float(top) * 1.15 or 1)
        ax.yaxis.set_major_locator(MaxNLocator(nbins=5))
        ax.yaxis.set_major_formatter(lambda value, _: f"${value:,.2f}")
        ax.set_ylabel("Price (USD/h)")
        name = instance_type[:LABEL_CHARS]
        ax.set_title(name if narrow else f"{name}: price per hour by zone", loc="left", color=INK)
        if narrow:
            fig.legend(loc="outside lower center", ncols=1)
        else:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
        return ax, hovers

    lines = "; ".join(
        f"{s.zone} {PRICING_NAMES.get(s.pricing_model, s.pricing_model)} ${s.points[-1][1]:.4f}/h now, "
        f"{len(s.points)} recorded price{'s' if len(s.points) != 1 else ''}"
        for s in drawn
    )
    desc = (
        f"Step chart of USD per hour from {_stamp(since)} to {_stamp(until)}, one line per zone and pricing "
        f"model: {lines}."
    )
    rows = len(drawn)
    return _both(draw, wide=(1000, 340), narrow=(320, 280 + 18 * rows), title=f"Price history of {instance_type}",
                 desc=desc)  # fmt: skip


def _unit_axis(ax: Axes, label: str, top: float, fmt: str) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_ylim(0, top)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
    ax.yaxis.set_major_formatter(lambda value, _: fmt.format(value))
    ax.set_ylabel(label)


def telemetry_chart(
    points: Sequence[tuple[dt.datetime, Decimal]], *, title: str, unit: str, label: str, since: dt.datetime,
    until: dt.datetime, top: float = 100, reference: tuple[float, str] | None = None, small: bool = False,
) -> SafeString:  # fmt: skip
    """One telemetry measure over time: ``points`` (moment, value in ``unit``) as a line, the y axis ``label``
    from 0 to ``top`` (or above, when a value exceeds it), time in UTC along x, an optional dashed
    ``reference`` level (value, name) with a legend, and a tooltip on each reported minute ("2026-12-01 14:05
    UTC: 93 %"). ``small`` draws it for a table cell. "" without points."""
    if not points:
        return mark_safe("")
    values = [float(v) for _, v in points]
    headroom = 1.08 if reference or max(values) >= top else 1  # a line along the top edge would hide in the frame
    ceiling = max([top, *values, reference[0] if reference else 0]) * headroom

    def draw(fig: Figure) -> tuple[Axes, list[Hover]]:
        import matplotlib.dates as mdates
        from matplotlib.ticker import MaxNLocator

        ax = fig.add_subplot()
        moments = [m for m, _ in points]
        ax.plot(mdates.date2num(moments), values, color=ACCENT, linewidth=2, marker="o" if len(points) == 1 else None,
                label=title.split(",")[0])  # fmt: skip
        # A tooltip per reported minute, over the span to the next report (the last: a minute).
        ends = [*moments[1:], moments[-1] + dt.timedelta(minutes=1)]
        hovers = [
            Hover(start=moment, end=min(end, until), value=value, text=f"{_stamp(moment)}: {value:g} {unit}")
            for moment, end, value in zip(moments, ends, values, strict=True)
        ]
        if reference:
            ax.axhline(reference[0], color=IDLE, linewidth=1.5, linestyle=(0, (4, 3)), label=reference[1])
            fig.legend(loc="outside lower center", ncols=2)  # below the plot, never over the line
        _time_axis(ax, narrow=True, since=since, until=until)
        _unit_axis(ax, label, ceiling, "{:.0f}")
        if small:  # a table cell: the unit on the ticks instead of an axis label, and fewer ticks
            ax.set_ylabel("")
            ax.yaxis.set_major_locator(MaxNLocator(nbins=2))
            ax.yaxis.set_major_formatter(lambda value, _: f"{value:.0f} {unit}")
            ax.set_xlabel("")
            ax.xaxis.set_major_locator(mdates.AutoDateLocator(tz=dt.UTC, minticks=2, maxticks=3))
            ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz=dt.UTC))
        return ax, hovers

    low, high = min(values), max(values)
    desc = (
        f"Line chart of {title} ({unit}) from {_stamp(since)} to {_stamp(until)}: {len(points)} "
        f"minute{'s' if len(points) != 1 else ''}, between {low:g} and {high:g} {unit}, latest {values[-1]:g} {unit}"
        + (f"; {reference[1]} is {reference[0]:g} {unit}." if reference else ".")
    )
    size = (240, 110) if small else (360, 240 if reference else 220)
    return mark_safe(_render(draw, size=size, title=title, desc=desc))  # noqa: S308 - serialized by ElementTree


def gpu_hours_chart(hours: Sequence[tuple[dt.datetime, Decimal, Decimal]], *, period: str) -> SafeString:
    """GPUs rented and idle per whole hour, ``hours`` being (hour start, rented, idle) oldest first: two step
    lines (rented solid, idle dashed) with a legend, GPUs up the side, UTC hours along the bottom, and a tooltip
    on each hour with both figures. "" when empty."""
    if not hours:
        return mark_safe("")
    since, until = hours[0][0], hours[-1][0] + dt.timedelta(hours=1)
    top = max(float(max(r, i)) for _, r, i in hours)

    def draw(fig: Figure, narrow: bool) -> tuple[Axes, list[Hover]]:
        import matplotlib.dates as mdates
        from matplotlib.ticker import MaxNLocator

        ax = fig.add_subplot()
        moments = [h for h, _, _ in hours] + [until]
        rented = [float(r) for _, r, _ in hours]
        idle = [float(i) for _, _, i in hours]
        at = mdates.date2num(moments)
        ax.step(at, rented + rented[-1:], where="post", color=ACCENT, linewidth=2, label="rented")
        ax.step(at, idle + idle[-1:], where="post", color=IDLE, linewidth=1.5, linestyle=(0, (4, 3)), label="idle")
        _time_axis(ax, narrow=narrow, since=since, until=until)
        ax.set_ylim(0, max(top * 1.15, 1))
        ax.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
        ax.set_ylabel("GPUs")
        fig.legend(loc="outside upper right", ncols=2)  # above the plot, never over the lines
        hovers = [
            Hover(start=hour, end=hour + dt.timedelta(hours=1), value=float(max(r, i)),
                  text=f"{_stamp(hour)}: {float(r):g} GPUs rented, {float(i):g} idle")
            for hour, r, i in hours
        ]  # fmt: skip
        return ax, hovers

    last = hours[-1]
    desc = (
        f"Step chart of GPUs rented and idle per hour over the {period}, from {_stamp(since)} to {_stamp(until)}; "
        f"at most {top:g} in one line; in the latest hour {float(last[1]):g} rented and {float(last[2]):g} idle."
    )
    return _both(draw, wide=(1000, 240), narrow=(320, 220), title=f"GPUs rented and idle, {period}", desc=desc)


def replicas_chart(
    points: Sequence[tuple[dt.datetime, int, int]], *, until: dt.datetime, maximum: int, minimum: int
) -> SafeString:
    """A fleet's replicas over time, ``points`` being (moment, running, desired) at each change, oldest first:
    running as a solid step line, desired as a dashed one, the fleet's maximum and minimum as thin bands, and a
    tooltip on each stretch ("2026-12-07 14:05 UTC: 3 running, 4 wanted"). "" without points."""
    if not points:
        return mark_safe("")
    since = points[0][0]
    until = max(until, since + dt.timedelta(minutes=1))
    top = max(maximum, *(max(r, d) for _, r, d in points))

    def draw(fig: Figure, narrow: bool) -> tuple[Axes, list[Hover]]:
        import matplotlib.dates as mdates
        from matplotlib.ticker import MaxNLocator

        ax = fig.add_subplot()
        moments = [m for m, _, _ in points] + [until]
        running = [float(r) for _, r, _ in points]
        desired = [float(d) for _, _, d in points]
        at = mdates.date2num(moments)
        ax.step(at, running + running[-1:], where="post", color=ACCENT, linewidth=2, label="live")
        ax.step(at, desired + desired[-1:], where="post", color=PALETTE[1], linewidth=1.5, linestyle=(0, (4, 3)),
                label="wanted")  # fmt: skip
        ax.axhline(maximum, color=IDLE, linewidth=1, linestyle=(0, (1, 2)), label=f"maximum {maximum}")
        if minimum:
            ax.axhline(minimum, color=IDLE, linewidth=1, linestyle=(0, (1, 4)), label=f"minimum {minimum}")
        _time_axis(ax, narrow=narrow, since=since, until=until)
        ax.set_ylim(0, max(top * 1.15, 1))
        ax.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
        ax.set_ylabel("Replicas")
        fig.legend(loc="outside upper right", ncols=4 if not narrow else 2)
        ends = moments[1:]
        hovers = [
            Hover(start=m, end=e, value=float(max(r, d)), text=f"{_stamp(m)}: {r} live, {d} wanted")
            for (m, r, d), e in zip(points, ends, strict=True)
        ]
        return ax, hovers

    last = points[-1]
    desc = (
        f"Step chart of the fleet's replicas from {_stamp(since)} to {_stamp(until)}: {len(points)} change"
        f"{'s' if len(points) != 1 else ''}, at most {max(r for _, r, _ in points)} live; now {last[1]} live "
        f"and {last[2]} wanted, between a minimum of {minimum} and a maximum of {maximum}."
    )
    return _both(draw, wide=(1000, 260), narrow=(320, 240), title="Replicas over time", desc=desc)
