"""PNG of a result: TTFT vs prompt length and throughput vs hit rate, the no-offload baseline beside."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.errors import InvalidSpec


def pyplot(report: str = "spillway loadtest report"):
    """matplotlib's pyplot, off-screen; InvalidSpec where matplotlib is missing. report: the command that draws
    the plot later from the result file."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidSpec("plotting needs matplotlib (pip install matplotlib); the JSON result is complete "
                          f"without it: `{report} RESULT --plot PNG` draws it later") from None
    return plt


def save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot(result: dict[str, Any], path: Path, baseline: dict[str, Any] | None = None) -> Path:
    plt = pyplot()
    summary = result.get("ttft", {}).get("summary") or []
    points = result.get("throughput", {}).get("points") or []
    panels = [name for name, present in (("ttft", summary), ("throughput", points)) if present]
    if not panels:
        raise InvalidSpec("the result holds no measured point to plot")
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    env = result.get("environment", {})
    fig.suptitle(f"{env.get('model', '?')} · vLLM {env.get('vllm_version') or '?'}"
                 + "".join(f" · {k}={v}" for k, v in sorted((env.get("labels") or {}).items())), fontsize=10)
    for ax, panel in zip(axes[0], panels):
        if panel == "ttft":
            _ttft(ax, summary, (baseline or {}).get("ttft", {}).get("summary") or [])
        else:
            _throughput(ax, points, (baseline or {}).get("throughput", {}).get("points") or [])
    return save(fig, path)


def _series(ax, rows: list[dict], key: str, label: str, style: str) -> None:
    rows = [r for r in rows if r.get(key)]
    if not rows:
        return
    x = [r["length"] for r in rows]
    med = [r[key]["median"] * 1e3 for r in rows]
    low = [m - r[key]["min"] * 1e3 for m, r in zip(med, rows)]
    high = [r[key]["max"] * 1e3 - m for m, r in zip(med, rows)]
    ax.errorbar(x, med, yerr=[low, high], fmt=style, capsize=3, label=label)


def _ttft(ax, summary: list[dict], baseline: list[dict]) -> None:
    from matplotlib.ticker import NullLocator, ScalarFormatter

    _series(ax, summary, "recompute_s", "first request (recompute)", "o-")
    _series(ax, summary, "repeat_s", "repeat, GPU copy evicted (from CPU)", "s-")
    _series(ax, baseline, "repeat_s", "repeat without offloading (baseline)", "x--")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    lengths = sorted({row["length"] for row in summary + baseline})
    ax.set_xticks(lengths, [f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n) for n in lengths])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("TTFT, ms (median, min-max)")
    ax.set_title("Time to first token")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def _throughput(ax, points: list[dict], baseline: list[dict]) -> None:
    def draw(rows: list[dict], label: str, style: str) -> None:
        rows = [p for p in rows if p.get("prompt_tokens_per_s")]
        if rows:
            ax.plot([p["target_hit_rate"] * 100 for p in rows], [p["prompt_tokens_per_s"] for p in rows], style,
                    label=label)

    draw(points, "with offloading", "o-")
    draw(baseline, "without offloading (baseline)", "x--")
    for p in points:
        achieved = (p.get("achieved") or {}).get("cpu_hit_rate")
        if achieved is not None and p.get("prompt_tokens_per_s"):
            ax.annotate(f"{achieved:.0%}", (p["target_hit_rate"] * 100, p["prompt_tokens_per_s"]),
                        textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    ax.set_xlabel("target CPU hit rate, % (labels: achieved)")
    ax.set_ylabel("prompt tokens/s")
    ax.set_title("Throughput vs CPU hit rate")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
