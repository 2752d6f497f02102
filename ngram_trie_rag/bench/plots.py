"""PNG charts of a benchmark result: speed-up, accept-length distribution, per-prompt speed.

Uses matplotlib's Agg backend (files only, no display), so it works on headless machines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = {"vanilla": "#7f7f7f", "hf-pld": "#1f77b4", "plain": "#9467bd", "chain": "#ff7f0e",
          "trie": "#2ca02c", "hf-static": "#17becf"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _color(name: str, i: int) -> str:
    return COLORS.get(name, f"C{i}")


def _title(results: dict, what: str) -> str:
    meta = results["meta"]
    return (f"{what}\n{meta['model']} {meta['dtype']}, {_threads(meta['threads'])}, "
            f"{meta['rows_used']} prompts of {Path(meta['data']).name}")


def _save(plt: Any, fig: Any, ax: Any, title: str, path: Path) -> Path:
    """Title the chart, write it as a PNG and free the figure (a run draws several)."""
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_speedup(results: dict, path: Path) -> Path:
    """Grouped bars: end-to-end and decode-only speed-up vs vanilla, per method."""
    plt = _pyplot()
    names = list(results["methods"])
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(names) + 2), 4.2))
    width = 0.38
    for j, (key, label, hatch) in enumerate((("speedup", "end-to-end (prefill incl.)", ""),
                                             ("decode_speedup", "decode only", "//"))):
        values = [results["methods"][m][key] or 0.0 for m in names]
        xs = [i + (j - 0.5) * width for i in range(len(names))]
        bars = ax.bar(xs, values, width, label=label, hatch=hatch, edgecolor="black",
                      color=[_color(m, i) for i, m in enumerate(names)], alpha=0.9 - 0.3 * j)
        ax.bar_label(bars, labels=[f"{v:.2f}x" for v in values], fontsize=8, padding=2)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("speed-up vs vanilla greedy")
    ax.set_ylim(0, max(1.2, *(v or 0 for m in results["methods"].values()
                               for v in (m["speedup"], m["decode_speedup"]))) * 1.15)
    ax.legend(fontsize=8, loc="upper left")
    return _save(plt, fig, ax, _title(results, "Speed-up"), path)


def plot_accept_lengths(results: dict, path: Path) -> Path:
    """Grouped bars: share of verification steps by accepted length, per method."""
    plt = _pyplot()
    # The reference decodes one token per step by construction: shown only if alone.
    reference = results["meta"].get("reference")
    hists = {m: r["accept_length_hist"] for m, r in results["methods"].items()
             if r["accept_length_hist"] and (m != reference or len(results["methods"]) == 1)}
    top = max((int(k) for h in hists.values() for k in h), default=1)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * top + 3), 4.2))
    width = 0.8 / max(len(hists), 1)
    for j, (name, hist) in enumerate(hists.items()):
        steps = sum(hist.values()) or 1
        shares = [100.0 * hist.get(str(k), 0) / steps for k in range(1, top + 1)]
        mean = results["methods"][name]["mean_accept_length"]
        ax.bar([k + (j - (len(hists) - 1) / 2) * width for k in range(1, top + 1)], shares,
               width, color=_color(name, j), label=f"{name} (mean {mean:.2f})")
    ax.set_xticks(range(1, top + 1))
    ax.set_xlabel("tokens per verification step (accepted draft + bonus)")
    ax.set_ylabel("% of steps")
    oracle = results["meta"].get("oracle_accept_length")
    what = "Accept-length distribution"
    if oracle:
        what += f" (oracle mean {oracle:.2f})"
    ax.legend(fontsize=8)
    return _save(plt, fig, ax, _title(results, what), path)


def plot_tokens_per_prompt(results: dict, path: Path) -> Path:
    """Lines: end-to-end tokens/s of every prompt, per method."""
    plt = _pyplot()
    prompts = results["prompts"]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.25 * len(prompts) + 4), 4.2))
    for j, name in enumerate(results["methods"]):
        xs = [p["index"] for p in prompts]
        ys = [p["methods"][name]["new_tokens"] / p["methods"][name]["total_s"] for p in prompts]
        ax.plot(xs, ys, marker="o", markersize=4, linewidth=1.2, color=_color(name, j),
                label=name)
    ax.set_xlabel("prompt index")
    ax.set_ylabel("tokens/s (prefill included)")
    ax.set_ylim(bottom=0)
    if len(prompts) <= 20:
        ax.set_xticks([p["index"] for p in prompts])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(plt, fig, ax, _title(results, "Tokens/s per prompt"), path)


def write_plots(results: dict, out_dir: str | Path) -> list[Path]:
    """All charts of a ``results.json`` document into ``out_dir``; returns the files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [
        plot_speedup(results, out / "speedup.png"),
        plot_accept_lengths(results, out / "accept_lengths.png"),
        plot_tokens_per_prompt(results, out / "tokens_per_s.png"),
    ]


def _threads(n: int) -> str:
    return f"{n} thread" if n == 1 else f"{n} threads"
