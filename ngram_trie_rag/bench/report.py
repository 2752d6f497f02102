"""Terminal tables and the JSON file: how results leave the process."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path


def write_json(doc: dict, path: str | Path) -> Path:
    """Write ``doc`` (creating parent folders); NaN/inf are refused, not silently written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return path


def fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    """A number for a table cell; ``-`` for missing values."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:{spec}}{suffix}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Plain aligned columns: first left-aligned, the rest right-aligned."""
    cells = [list(header), *[list(r) for r in rows]]
    widths = [max(len(r[c]) for r in cells) for c in range(len(header))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) if c == 0 else v.rjust(w)
                         for c, (v, w) in enumerate(zip(r, widths, strict=True)))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def bench_table(results: dict) -> str:
    """The benchmark summary: one row per method, then the run's settings. Answer
    quality (mean token F1 and share of answers containing a gold answer) gets columns
    when the rows had gold answers."""
    meta = results["meta"]
    header = ["method", "tok/s", "decode tok/s", "speedup", "decode speedup", "TTFT ms",
              "accept len",
              "of oracle", "of own oracle", "nodes/step", "of same-size", "draft time",
              "exact"]
    scored = any((m.get("quality") or {}).get("scored") for m in results["methods"].values())
    if scored:
        header += ["F1", "contains"]
    rows = []
    for name, m in results["methods"].items():
        quality = m.get("quality") or {}
        rows.append([
            name, fmt(m["tokens_per_s"], ".1f"), fmt(m["decode_tokens_per_s"], ".1f"),
            fmt(m["speedup"], ".2f", "x"), fmt(m["decode_speedup"], ".2f", "x"),
            fmt(None if m.get("ttft_s") is None else m["ttft_s"] * 1e3, ".0f"),
            fmt(m["mean_accept_length"]), fmt(_pct(m["oracle_share"]), ".0f", "%"),
            fmt(_pct(m.get("own_oracle_share")), ".0f", "%"),
            fmt(m.get("drafted_per_step"), ".1f"),
            fmt(_pct(m.get("same_size_share")), ".0f", "%"),
            fmt(_pct(m["draft_time_share"]), ".1f", "%"),
            f"{round(m['exact_match_rate'] * m['prompts'])}/{m['prompts']}",
            *([fmt(quality.get("f1"), ".2f"), fmt(_pct(quality.get("contains")), ".0f", "%")]
              if scored else []),
        ])
    d = meta["drafter"]
    footer = (
        f"oracle accept length {fmt(meta['oracle_accept_length'])} | {meta['rows_used']} prompts "
        f"of {Path(meta['data']).name}, max_new_tokens {meta['max_new_tokens']} | "
        f"{meta['model']} {meta['dtype']}{_weights(meta)} on {meta['device']}, "
        f"{_threads(meta['threads'])} | "
        f"n={d['n']} L_p={d['prefix_len']} num_draft={_budget(d)}"
        + (f" | latency curve: {meta['latency_curve']}" if meta.get("latency_curve") else "")
        + (f" ({'measured' if meta['variants_chosen'] else 'stock'} forward variants)"
           if "variants_chosen" in meta else "")
        + (f" | engine: {meta['engine']}" if meta.get("engine") else "")
    )
    if meta.get("repetition_stop"):
        footer += (f"\nrepetition stop n={meta['repetition_stop']}: every method's answer "
                   "ends before its first repeated n-gram")
    if meta.get("background_load"):
        footer += (f"\nbusy host: {meta['background_load']} CPU-spinning process(es) ran "
                   "beside the whole run")
    fewer = fewer_threads_shares(results, meta.get("threads"))
    if fewer:
        footer += ("\nsteps the engine ran on fewer threads than given (it times its "
                   "forwards and drops threads that only wait): "
                   + ", ".join(f"{m} {fmt(_pct(share), '.0f', '%')}"
                               for m, share in fewer.items()))
    capped = meta.get("oracle_by_max_draft")
    if capped:
        footer += ("\noracle with at most K draft tokens per step: "
                   + ", ".join(f"K={k} {fmt(v)}" for k, v in capped.items()))
    if meta.get("grammar"):
        footer += (f"\ngrammar {meta['grammar']}: speed-ups and exactness against "
                   f"constrained plain greedy ({meta['reference']}); tokens the grammar "
                   "forced: " + ", ".join(f"{m} {fmt(_pct(share), '.0f', '%')}"
                                          for m, share in forced_shares(results).items()))
    return table(header, rows) + "\n" + footer


def fewer_threads_shares(results: dict, threads: int | None) -> dict[str, float]:
    """Per engine method, the share of its steps that ran on fewer intra-op threads
    than the run was given; only methods where any did."""
    out = {}
    for name in results["methods"]:
        counts: dict[int, int] = {}
        for p in results["prompts"]:
            used = (p["methods"][name].get("extra") or {}).get("threads_used") or {}
            for t, n in used.items():
                counts[int(t)] = counts.get(int(t), 0) + n
        total = sum(counts.values())
        given = threads or max(counts, default=0)
        fewer = sum(n for t, n in counts.items() if t < given)
        if total and fewer:
            out[name] = fewer / total
    return out


def forced_shares(results: dict) -> dict[str, float]:
    """Per method, the share of answer tokens the grammar forced (drafted for free)."""
    out = {}
    for name in results["methods"]:
        runs = [p["methods"][name] for p in results["prompts"]]
        tokens = sum(r["new_tokens"] for r in runs)
        forced = sum((r.get("extra") or {}).get("forced_tokens", 0) for r in runs)
        out[name] = forced / tokens if tokens else 0.0
    return out


def sweep_tables(doc: dict) -> str:
    """The n x L_p grid at the fixed num_draft, then the num_draft row at the fixed (n, L_p)."""
    meta, cells = doc["meta"], doc["cells"]
    by_key = {(c["n"], c["prefix_len"], c["num_draft"]): c for c in cells}
    replay = meta["replay"]
    what = "mean accept length" if replay else "decode speedup / mean accept length"
    k = meta["fixed_num_draft"]
    grid = table(
        ["n \\ L_p", *(str(lp) for lp in meta["prefix_lens"])],
        [[str(n), *(_cell(by_key.get((n, lp, k)), replay) for lp in meta["prefix_lens"])]
         for n in meta["ns"]],
    )
    n, lp = meta["fixed_n"], meta["fixed_prefix_len"]
    row = table(
        ["num_draft", *(str(kk) for kk in meta["num_drafts"])],
        [[f"n={n} L_p={lp}", *(_cell(by_key.get((n, lp, kk)), replay)
                              for kk in meta["num_drafts"])]],
    )
    ref = doc["reference"]
    footer = (f"vanilla {fmt(ref['tokens_per_s'], '.1f')} tok/s, decode "
              f"{fmt(ref['decode_tokens_per_s'], '.1f')} tok/s | oracle accept length "
              f"{fmt(meta['oracle_accept_length'])} | {meta['rows_used']} prompts, "
              f"max_new_tokens {meta['max_new_tokens']} | drafter "
              f"{meta.get('method', 'trie')}")
    return (f"{what}, num_draft={k}\n{grid}\n\n{what}\n{row}\n{footer}")


def _budget(drafter: dict) -> str:
    """A pinned num_draft, else the generator's own setting (e.g. "32, adaptive")."""
    if drafter["num_draft"] is not None:
        return str(drafter["num_draft"])
    config = drafter.get("generator_config") or {}
    return f"{config.get('num_draft')}{', adaptive' if config.get('adaptive') else ''} (default)"


def _cell(c: dict | None, replay: bool) -> str:
    if c is None:
        return "-"
    if replay:
        return fmt(c["mean_accept_length"])
    return f"{fmt(c['decode_speedup'], '.2f', 'x')} / {fmt(c['mean_accept_length'])}"


def _pct(share: float | None) -> float | None:
    return None if share is None else 100.0 * share


def _threads(n: int) -> str:
    return f"{n} thread" if n == 1 else f"{n} threads"


def _weights(meta: dict) -> str:
    """`` int4, weights 112.7 MB``: the quantization and the loaded weights' memory (older
    result files have neither)."""
    size = meta.get("weights_bytes")
    if size is None:
        return ""
    scheme = meta.get("quantization")
    return f"{f' {scheme}' if scheme else ''}, weights {size / 1e6:.1f} MB"
