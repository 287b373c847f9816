"""The dashboard's charts, drawn on the server as inline SVG (no script): a metric's samples
around a change (the diagnosis page) and the swimlane, one row per lane and a mark per item at
its time (a job's evidence across nodes, a node's failed jobs by the part it played, a GPU's
failures by where it was installed). The functions return the numbers; the templates
(_sattrib_swimlane.html, sattrib_diagnosis.html) draw them."""
import time
from datetime import datetime, timezone

CHART_W, CHART_H = 240, 48
LANE_H, LANE_LABEL_W, LANE_W, MAX_LANES = 16, 130, 560, 32
# Drawn in this order (later on top), and how each looks: (fill, width, height, opacity).
MARK_STYLE = {"symptom": ("#8a8a8a", 3, 8, 0.55), "workload": ("#8a8a8a", 5, 10, 0.7),
              "context": ("#3a5a97", 3, 8, 0.8), "confirmation": ("#e08a00", 4, 10, 1),
              "infra": ("#b3261e", 6, 12, 1), "root": ("#b3261e", 7, 14, 1)}


def epoch(stamp) -> float | None:
    """An ISO-8601 time stamp as epoch seconds (UTC when it names no zone), or None."""
    try:
        at = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None
    return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()


def metric_chart(metric: dict, stamp) -> dict | None:
    """An inline SVG chart of a metric's samples around the change (the failures-per-day
    chart's style, no script): polyline points in a CHART_W x CHART_H box, the value range,
    and where the evidence's time stamp falls."""
    pts = [(float(t), float(v)) for t, v in metric.get("points") or []]
    if len(pts) < 2:
        return None
    t0, t1 = pts[0][0], pts[-1][0]
    lo, hi = min(v for _, v in pts), max(v for _, v in pts)
    span_t, span_v = (t1 - t0) or 1.0, (hi - lo) or 1.0

    def x(t):
        return round(2 + (CHART_W - 4) * (t - t0) / span_t, 1)

    def y(v):
        return round(CHART_H - 2 - (CHART_H - 4) * (v - lo) / span_v, 1)
    at = epoch(stamp) if stamp else None
    mark = x(at) if at is not None and t0 <= at <= t1 else None
    fmt = lambda v: f"{v:g}"  # noqa: E731
    return {"w": CHART_W, "h": CHART_H, "mark": mark, "lo": fmt(lo), "hi": fmt(hi),
            "points": " ".join(f"{x(t)},{y(v)}" for t, v in pts),
            "from": time.strftime("%H:%M", time.gmtime(t0)),
            "to": time.strftime("%H:%M", time.gmtime(t1))}


def swimlane(items: list[tuple], lanes: list[tuple], max_lanes: int = MAX_LANES) -> dict | None:
    """An inline SVG swimlane: `lanes` is [(key, label, href)] top to bottom, `items` is
    [(lane key, ISO time, kind, title)] with kind a key of MARK_STYLE. Items without a time,
    or on a lane past max_lanes, are not drawn; marks that fall on the same pixel of a lane
    and kind are drawn once, their title counting them. None when nothing has a time."""
    timed = [(k, at, kind, title) for k, stamp, kind, title in items
             if stamp and (at := epoch(stamp)) is not None]
    if not timed:
        return None
    keys = [k for k, _, _ in lanes]
    row = {k: i for i, k in enumerate(keys[:max_lanes])}
    t0, t1 = min(t for _, t, _, _ in timed), max(t for _, t, _, _ in timed)
    span = t1 - t0

    def x(t):
        return round(LANE_W / 2 if not span else 6 + (LANE_W - 12) * (t - t0) / span, 1)
    marks: dict = {}
    order = list(MARK_STYLE)
    for k, t, kind, title in timed:
        if k not in row:
            continue
        key = (row[k], x(t), kind)
        if key in marks:
            marks[key]["n"] += 1
        else:
            marks[key] = {"title": title, "n": 1}
    drawn = []
    for (i, at, kind), m in sorted(marks.items(), key=lambda kv: (order.index(kv[0][2]),
                                                                 kv[0][0], kv[0][1])):
        fill, w, h, opacity = MARK_STYLE[kind]
        drawn.append({"cls": kind, "x": round(at - w / 2, 1), "y": i * LANE_H + (LANE_H - h) / 2,
                      "w": w, "h": h, "fill": fill, "opacity": opacity,
                      "title": m["title"] + (f" (x{m['n']})" if m["n"] > 1 else "")})
    fmt = "%H:%M:%S" if time.gmtime(t0)[:3] == time.gmtime(t1)[:3] else "%Y-%m-%d %H:%M"
    shown = lanes[:max_lanes]
    return {"w": LANE_W, "label_w": LANE_LABEL_W, "lane_h": LANE_H,
            "h": len(shown) * LANE_H, "marks": drawn,
            "lanes": [{"label": label, "href": href, "y": i * LANE_H}
                      for i, (_, label, href) in enumerate(shown)],
            "more": max(0, len(lanes) - max_lanes),
            "from": time.strftime(fmt, time.gmtime(t0)),
            "to": time.strftime(fmt, time.gmtime(t1)),
            "span": _span(span)}


def _span(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s" if s >= 1 or not s else f"{s * 1000:.0f} ms"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.0f} h" if s < 172800 else f"{s / 86400:.0f} days"
