"""What a readable chart is, for the report's chart tests: no two of its texts overlap."""

from __future__ import annotations

import math


def overlaps(fig) -> list[tuple[str, str]]:
    """Pairs of visible texts (tick labels, annotations, titles, legends), or a legend and a bar,
    that overlap.

    Texts whose boxes overlap clash, except slanted tick labels: parallel strips, which overlap
    only when the distance between their baselines (their anchors' horizontal distance x sin of
    the angle) is under a line's height.
    """
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    items = []
    for ax in fig.axes:
        texts = [*ax.get_xticklabels(), *ax.texts, ax.title, ax.xaxis.label]
        items += [(t, t.get_window_extent(renderer)) for t in texts if t.get_text()]
        if ax.get_legend() is not None:
            items.append((ax.get_legend(), ax.get_legend().get_window_extent(renderer)))
    found = []
    for ax in fig.axes:  # a legend inside the axes must not cover a bar or a marker
        if ax.get_legend() is not None:
            box = ax.get_legend().get_window_extent(renderer)
            bars = [p for p in ax.patches if p.get_height() > 0 and p.get_width() > 0]
            found += [("legend", "bar") for p in bars if box.overlaps(p.get_window_extent())]
            found += [("legend", "marker") for xy in _markers(ax) if box.contains(*xy)]
    for i, (a, box_a) in enumerate(items):
        for b, box_b in items[i + 1 :]:
            if not (box_a.overlaps(box_b) and box_a.width > 0 and box_b.width > 0):
                continue
            slanted = [getattr(t, "get_rotation", lambda: 0)() for t in (a, b)]
            clash = True
            if slanted[0] and slanted[0] == slanted[1]:
                height = a.get_fontsize() * fig.dpi / 72
                xa, xb = (renderer.points_to_pixels(0) + t.get_window_extent(renderer).x1
                          for t in (a, b))  # fmt: skip
                clash = abs(xa - xb) * math.sin(math.radians(slanted[0])) < height
            if clash:
                found.append((getattr(a, "get_text", lambda: "legend")(),
                              getattr(b, "get_text", lambda: "legend")()))  # fmt: skip
    return found


def _markers(ax) -> list[tuple[float, float]]:
    """Where the axes' markers (a line's points drawn with a marker, a scatter's dots) sit, in
    pixels."""
    points = [
        ax.transData.transform(line.get_xydata())
        for line in ax.lines
        if line.get_marker() not in (None, "", "None", " ") and len(line.get_xydata())
    ]
    points += [c.get_offset_transform().transform(c.get_offsets()) for c in ax.collections
               if len(c.get_offsets())]  # fmt: skip
    return [tuple(xy) for p in points for xy in p]
