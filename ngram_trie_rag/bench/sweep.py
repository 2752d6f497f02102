"""The paper's hyper-parameter table: a tree drafter over a grid of (n, L_p, num_draft).

The reference (vanilla greedy) runs once per prompt. Then either every cell runs the
model (``trie`` method, timed, exactness checked), or, with ``replay``, every cell's
accept lengths are derived without the model: greedy output is deterministic, so
walking each step's draft tree along the reference answer gives exactly the steps the
generator would take (the trie is built by the generator's own code).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from tqdm.auto import tqdm

from ..drafting.oracle import oracle_accept_length, replay_accept_lengths
from ..generator import SpeculativeGenerator
from .config import SweepConfig
from .data import load_items
from .meta import command_line, environment
from .methods import Run, measure_prefill, run_core, run_vanilla
from .metrics import pooled_oracle, ratio, summarise
from .runner import WARMUP_TOKENS, encode_item, load_generator, rotated

Cell = tuple[int, int, int]  # (n, L_p, num_draft)


def cell_label(cell: Cell) -> str:
    n, lp, k = cell
    return f"n{n}-lp{lp}-k{k}"


def replay_cell(gen: SpeculativeGenerator, prompt_ids: list[int],
                doc_ids: list[list[int]] | None, answer: Sequence[int],
                max_new_tokens: int | None = None, method: str = "trie",
                drafted: list[int] | None = None) -> list[int]:
    """Accept lengths ``gen`` (with its n, L_p, num_draft) would get producing ``answer``,
    with the draft depth capped by ``max_new_tokens`` exactly as the generator caps it;
    ``drafted`` receives each step's draft size."""
    drafter = gen.drafter(prompt_ids, doc_ids, method, num_draft=gen.config.num_draft)
    return replay_accept_lengths(drafter, list(answer), max_new_tokens, drafted)


def run_sweep(cfg: SweepConfig, generator: SpeculativeGenerator | None = None,
              progress: bool = True) -> dict:
    """Run the grid and return the ``sweep.json`` document (see :func:`sweep_tables`)."""
    items = load_items(cfg.data, cfg.limit)  # before the model: bad data fails fast
    gen = load_generator(cfg, generator)
    cells = cfg.cells()
    gens = {c: gen.reshaped(n=c[0], prefix_len=c[1], num_draft=c[2]) for c in cells}
    prompts = [encode_item(gen, it) for it in items]

    for _ in range(cfg.warmup):
        short = min(WARMUP_TOKENS, cfg.max_new_tokens)
        run_vanilla(gen, prompts[0], short, 0.0)
        if not cfg.replay:
            run_core(gens[cells[0]], prompts[0], items[0].documents, short, cfg.method,
                     cells[0][2])

    reference: list[Run] = []
    runs: dict[Cell, list[Run]] = {c: [] for c in cells}  # timed cells
    replayed: dict[Cell, list[list[int]]] = {c: [] for c in cells}  # replayed accept lengths
    records = []
    bar = tqdm(list(zip(items, prompts, strict=True)), desc="sweep", unit="prompt",
               disable=not progress)
    for i, (item, ids) in enumerate(bar):
        prefill = measure_prefill(gen, ids)
        ref = run_vanilla(gen, ids, cfg.max_new_tokens, prefill)
        ref.exact = True
        reference.append(ref)
        if cfg.replay:
            doc_ids = gen.encode_documents(item.documents) if item.documents else None
            for c in cells:
                replayed[c].append(replay_cell(gens[c], ids, doc_ids, ref.token_ids,
                                               cfg.max_new_tokens, cfg.method))
            per_cell = {c: {"accept_lengths": replayed[c][-1]} for c in cells}
        else:
            for c in rotated(cells, i):
                # num_draft pinned: the table is about fixed budgets
                run = run_core(gens[c], ids, item.documents, cfg.max_new_tokens, cfg.method,
                               c[2])
                run.exact = run.token_ids == ref.token_ids
                runs[c].append(run)
            per_cell = {c: runs[c][-1].to_dict() for c in cells}
        records.append({
            "index": i, "id": item.id, "prompt_tokens": len(ids),
            "oracle_accept_length": oracle_accept_length(ids, ref.token_ids),
            "reference_ids": ref.token_ids, "vanilla": ref.to_dict(),
            "cells": {cell_label(c): per_cell[c] for c in cells},
        })
    bar.close()

    oracle_mean = pooled_oracle([r["oracle_accept_length"] for r in records],
                                [r.new_tokens for r in reference])
    meta = environment(gen) | {
        "command": command_line(cfg.command), "data": str(cfg.data), "rows_used": len(items),
        "max_new_tokens": cfg.max_new_tokens, "replay": cfg.replay, "warmup": cfg.warmup,
        "method": cfg.method,
        "ns": list(cfg.ns), "prefix_lens": list(cfg.prefix_lens),
        "num_drafts": list(cfg.num_drafts), "fixed_n": cfg.fixed_n,
        "fixed_prefix_len": cfg.fixed_prefix_len, "fixed_num_draft": cfg.fixed_num_draft,
        "oracle_accept_length": oracle_mean,
    }
    cell_rows = []
    for c in cells:
        row = {"label": cell_label(c), "n": c[0], "prefix_len": c[1], "num_draft": c[2]}
        row |= (_replay_summary(replayed[c]) if cfg.replay
                else summarise(runs[c], reference, oracle_mean))
        row["oracle_share"] = (ratio(row["mean_accept_length"], oracle_mean)
                               if row["mean_accept_length"] is not None and oracle_mean
                               else None)
        cell_rows.append(row)
    return {"meta": meta, "reference": summarise(reference, reference, oracle_mean),
            "cells": cell_rows, "prompts": records}


def _replay_summary(per_prompt: Sequence[list[int]]) -> dict:
    """Accept lengths only: a replay measures no time and checks no output."""
    lengths = [a for steps in per_prompt for a in steps]
    counts = Counter(lengths)
    return {
        "prompts": len(per_prompt), "tokens_per_s": None, "decode_tokens_per_s": None,
        "speedup": None, "decode_speedup": None, "steps": len(lengths),
        "mean_accept_length": ratio(sum(lengths), len(lengths)),
        "accept_length_hist": {str(k): counts[k] for k in sorted(counts)},
        "exact_match_rate": None,
    }
