"""Pictures (matplotlib, the optional `plot` extra, drawn off-screen with the Agg backend): a simulated pipeline's
timeline with each stage's memory under it, and time against memory for algorithms or layouts."""

from __future__ import annotations

import io
from pathlib import Path

from .io import InputError, write_atomic

GiB = 2**30
COLORS = {"forward": "#4C72B0", "backward": "#55A868", "exposed recompute": "#C44E52",
          "hidden recompute": "#DD8452", "TP collective": "#8C8C8C", "DP collective": "#8172B3"}
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
        return "forward" if name.startswith("F ") else "backward"
    return {"tp collective": "TP collective", "recompute (side)": "hidden recompute",
            "dp collective": "DP collective"}.get(tid)


# Where each category sits inside a stage's row (bottom, height), the row spanning [s - 0.45, s + 0.45].
_LANES = {"forward": (-0.15, 0.5), "backward": (-0.15, 0.5), "exposed recompute": (-0.15, 0.5),
          "TP collective": (-0.42, 0.22), "DP collective": (-0.42, 0.22), "hidden recompute": (0.37, 0.08)}


def timeline(events: list[dict], memory: list[list[tuple[float, int]]], static: list[int], limit: int, title: str,
             path: Path) -> None:
    """The pipeline, one row per stage (forward, backward, exposed recomputation on the compute stream; TP and DP
    collectives below; hidden side-stream recomputation above), and under it each stage's memory (static plus
    activations) over time against the limit."""
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
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, list(COLORS), ncol=6, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False,
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
    for pt in points:
        if pt.get(y) is None or pt.get("peak_memory_bytes") is None:
            continue
        algo = pt["algo"]
        ax.scatter(pt["peak_memory_bytes"] / GiB, pt[y], color=ALGO_COLORS.get(algo, "#333333"), s=28,
                   label=algo if algo not in seen else None, zorder=3)
        seen.add(algo)
        if pt.get("label"):
            ax.annotate(pt["label"], (pt["peak_memory_bytes"] / GiB, pt[y]), textcoords="offset points",
                        xytext=(4, 3), fontsize=7)
    ax.axvline(limit / GiB, color="#C44E52", linestyle="--", linewidth=1.0, label="memory limit")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel({"iteration_time_s": "iteration time (s)", "tokens_per_s_per_gpu": "tokens/s per GPU"}.get(y, y))
    ax.set_title(title, loc="left")
    ax.grid(True, linewidth=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
