"""Pictures (matplotlib, the optional `plot` extra, drawn off-screen with the Agg backend): a simulated pipeline's
timeline with each stage's memory under it, and time against memory for algorithms or layouts."""

from __future__ import annotations

import io
from pathlib import Path

from .io import InputError, write_atomic

GiB = 2**30
COLORS = {"forward": "#4C72B0", "backward": "#55A868", "exposed recompute": "#C44E52",
          "hidden recompute": "#DD8452", "TP collective": "#8C8C8C", "DP collective": "#8172B3",
          "CP exchange": "#937860", "optimizer step": "#8C564B", "host copy": "#64B5CD", "offload stall": "#DA8BC3"}
ALGO_COLORS = {"heu": "#C44E52", "opt": "#8172B3", "full": "#4C72B0", "selective": "#55A868", "block": "#DD8452",
               "uniform": "#937860", "none": "#8C8C8C", "checkmate": "#DA8BC3", "adapipe": "#64B5CD"}


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise InputError("--plot needs matplotlib: pip install 'lynx-planner[plot]'") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "lynx", "font.size": 9})
    return plt


def _save(fig, path: Path) -> None:
    """PNG (or any format matplotlib knows from the suffix), written atomically, without a timestamp."""
    fmt = path.suffix.lstrip(".").lower() or "png"
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=fmt, dpi=130, bbox_inches="tight", metadata={"Software": None} if fmt == "png"
                    else None)
    except ValueError as e:
        raise InputError(f"{path}: --plot: {e}") from None
    write_atomic(path, buf.getvalue())  # as every output: the umask's mode, a symlink's target replaced


def _category(event: dict) -> str | None:
    tid, name = event["tid"], event["name"]
    if tid == "compute":
        if name.startswith("R "):
            return "exposed recompute"
        if name.startswith("wait H2D"):
            return "offload stall"
        return "forward" if name.startswith("F ") else "backward"
    if tid == "dp collective" and not name.startswith("DP "):  # the optimizer step, also at dp 1
        return "optimizer step"
    return {"tp collective": "TP collective", "recompute (side)": "hidden recompute",
            "dp collective": "DP collective", "cp exchange": "CP exchange", "copy engine": "host copy"}.get(tid)


# Where each category sits inside a stage's row (bottom, height), the row spanning [s - 0.45, s + 0.45].
_LANES = {"forward": (-0.15, 0.5), "backward": (-0.15, 0.5), "exposed recompute": (-0.15, 0.5),
          "TP collective": (-0.42, 0.22), "DP collective": (-0.42, 0.22), "optimizer step": (-0.42, 0.22),
          "CP exchange": (-0.42, 0.22), "hidden recompute": (0.37, 0.08), "offload stall": (-0.15, 0.5),
          "host copy": (0.37, 0.08)}  # the copy engine shares the side lane: both run beside the compute stream


def timeline(events: list[dict], memory: list[list[tuple[float, int]]], static: list[int], limit: int, title: str,
             path: Path, xmax: float | None = None) -> None:
    """The pipeline, one row per stage (forward, backward, exposed recomputation on the compute stream; TP and DP
    collectives below; hidden side-stream recomputation above), and under it each stage's memory (static plus
    activations) over time against the limit. `xmax`: the time axis' end, to draw several plans on one scale."""
    plt = _pyplot()
    p = len(memory)
    fig, (ax, axm) = plt.subplots(2, 1, figsize=(12, 2.2 + 0.28 * p + 3), sharex=True,
                                  gridspec_kw={"height_ratios": [max(2.0, 0.28 * p), 3]})
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = _category(e)
        if cat is not None:
            bars.setdefault((e["pid"], cat), []).append((e["ts"] / 1e6, e["dur"] / 1e6))
    for (s, cat), spans in sorted(bars.items()):
        bottom, height = _LANES[cat]
        ax.broken_barh(spans, (s + bottom, height), facecolors=COLORS[cat], linewidth=0)
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_yticks(range(p) if p <= 16 else range(0, p, max(1, p // 16)))
    ax.set_ylabel("stage")
    fig.suptitle(title, x=0.01, ha="left", fontsize=10)
    present = [cat for cat in COLORS if any(c == cat for _, c in bars)]  # only what occurs
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[cat]) for cat in present]
    ax.legend(handles, present, ncol=6, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False,
              fontsize=8)
    cmap = plt.get_cmap("viridis")
    for s, (deltas, base) in enumerate(zip(memory, static)):
        xs, ys, cur = [0.0], [base / GiB], 0
        for t, d in sorted(deltas):
            xs.append(t)
            ys.append((base + cur) / GiB)
            cur += d
            xs.append(t)
            ys.append((base + cur) / GiB)
        axm.plot(xs, ys, color=cmap(s / max(1, p - 1)), linewidth=1.0, label=f"stage {s}" if p <= 8 else None)
    axm.axhline(limit / GiB, color="#C44E52", linestyle="--", linewidth=1.0, label="memory limit")
    axm.set_ylabel("memory per GPU (GiB)")
    axm.set_xlabel("time (s)")
    axm.legend(ncol=min(p + 1, 9), fontsize=7, loc="lower center", frameon=False)
    if xmax is not None:
        axm.set_xlim(0, xmax)
    if p > 8:
        sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, p - 1))
        fig.colorbar(sm, ax=axm, label="stage", pad=0.01)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def time_memory(points: list[dict], limit: int, title: str, path: Path, y: str = "iteration_time_s") -> None:
    """One point per algorithm (compare) or per (layout, algorithm) (tune): peak memory per GPU against iteration
    time or tokens/s per GPU; labelled points, the memory limit as a line. Points need algo, peak_memory_bytes, the
    `y` key and optionally label."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    seen = set()
    shown = [pt for pt in points if pt.get(y) is not None and pt.get("peak_memory_bytes") is not None]
    drawn: dict[tuple[float, float], int] = {}  # markers already at a position
    for pt in shown:
        algo, color = pt["algo"], ALGO_COLORS.get(pt["algo"], "#333333")
        at = (round(pt["peak_memory_bytes"] / GiB, 3), round(pt[y], 6))
        k = drawn.get(at, 0)
        drawn[at] = k + 1
        # a point on top of another (full and uniform, HEU and none at a loose limit) is a ring around it, not hidden
        style = {"color": color, "s": 28} if k == 0 else {"facecolors": "none", "edgecolors": color,
                                                        "s": 28 + 45 * k, "linewidths": 1.5}
        ax.scatter(at[0], pt[y], label=algo if algo not in seen else None, zorder=3 + k, **style)
        seen.add(algo)
    xs = [pt["peak_memory_bytes"] / GiB for pt in shown] + [limit / GiB]
    ys = [pt[y] for pt in shown] or [0.0]
    placed: list[tuple[float, float, int]] = []  # labels drawn: x, y, vertical offset (points)
    for (x, yv), labels in label_groups([(pt["peak_memory_bytes"] / GiB, pt[y], pt.get("label")) for pt in shown],
                                        max(xs) - min(xs), max(ys) - min(ys)):
        text = ", ".join(labels[:3]) + (f" +{len(labels) - 3}" if len(labels) > 3 else "")
        right = x > (min(xs) + max(xs)) / 2  # right half: the label to the left, off the limit line and the edge
        # a label near one already drawn (labels are ~1/4 of the axis wide) moves down a line
        near = [off for px, py, off in placed if abs(px - x) < 0.25 * ((max(xs) - min(xs)) or 1)
                and abs(py - yv) < 0.04 * ((max(ys) - min(ys)) or 1)]
        offset = min([3, *[o - 10 for o in near]])
        placed.append((x, yv, offset))
        ax.annotate(text, (x, yv), textcoords="offset points", xytext=(-6 if right else 6, offset), fontsize=7,
                    ha="right" if right else "left", bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none",
                                                           "alpha": 0.7})
    missing = [pt for pt in points if pt not in shown]
    if missing:  # said, not silently left out
        ax.text(0.01, 0.01, "not shown (no plan within the limit): " + ", ".join(
            f"{pt.get('label') or pt['algo']}" + (f" needs {pt['peak_memory_bytes'] / GiB:.2f} GiB"
                                                  if pt.get("peak_memory_bytes") else "") for pt in missing[:6])
            + (f" +{len(missing) - 6}" if len(missing) > 6 else ""), transform=ax.transAxes, fontsize=7,
            color="#555555")
    ax.axvline(limit / GiB, color="#C44E52", linestyle="--", linewidth=1.0, label="memory limit")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel({"iteration_time_s": "iteration time (s)", "tokens_per_s_per_gpu": "tokens/s per GPU"}.get(y, y))
    ax.set_title(title, loc="left")
    ax.grid(True, linewidth=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def label_groups(points: list[tuple[float, float, str | None]], x_range: float, y_range: float
                 ) -> list[tuple[tuple[float, float], list[str]]]:
    """Labels of points that would print over each other (within 3% of the axes of the first of a group) joined
    into one: 'full, uniform' instead of 'fuinform'."""
    groups: list[tuple[tuple[float, float], list[str]]] = []
    dx, dy = 0.03 * (x_range or 1.0), 0.04 * (y_range or 1.0)
    for x, y, label in points:
        if not label:
            continue
        for (gx, gy), labels in groups:
            if abs(x - gx) <= dx and abs(y - gy) <= dy:
                labels.append(label)
                break
        else:
            groups.append(((x, y), [label]))
    return groups
