"""The benchmark loop: every method on every prompt, interleaved, after a warm-up.

For prompt i the methods run in the order rotated by i, so slow drift (thermal, other
load) hits all methods alike. Per prompt, one separate prompt forward is timed for the
Hugging Face methods' prefill, and the oracle accept length is computed from the
reference (vanilla) answer -- with any draft length, and with at most K draft tokens per
step for K in :data:`ORACLE_MAX_DRAFT` -- and from every method's own answer (in bf16
the answers of different methods can differ, and each method's accepted length is
counted on its own answer). For this library's drafters it also computes, step by
step, what the best copy could have accepted with the same number of draft nodes
(:func:`~ngram_trie_rag.drafting.oracle.same_size_bounds`): how well the nodes were chosen,
apart from how many. Where a row has gold answers, every method's own answer text is
scored against them (:mod:`~ngram_trie_rag.bench.quality`), so that a speed-up bought
with degenerate text shows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from ..drafting.oracle import oracle_accept_length, same_size_bounds
from ..generator import SpeculativeGenerator
from ..prompts import before_stop
from .config import BenchConfig, RunConfig
from .data import BenchItem, load_items
from .grammars import bench_grammar
from .meta import command_line, environment
from .methods import Run, make_runners, measure_prefill
from .metrics import pooled_oracle, summarise
from .quality import score

WARMUP_TOKENS = 8
#: Draft sizes K at which the oracle is also reported with at most K draft tokens per
#: step: the ceiling for a drafter that verifies K nodes, whatever its selection.
ORACLE_MAX_DRAFT = (1, 2, 4, 8, 16, 32, 64)


def load_generator(cfg: RunConfig, generator: SpeculativeGenerator | None = None,
                   **draft: int) -> SpeculativeGenerator:
    """Set the thread count first (it applies to everything after), then load the model,
    or reuse ``generator``'s model under ``draft``'s hyper-parameters."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if generator is None:
        generator = SpeculativeGenerator.from_pretrained(cfg.model, device=cfg.device,
                                                         dtype=cfg.dtype, engine=cfg.engine,
                                                         quantization=cfg.quantization)
    # Every method prefills its whole prompt, as generate does: a cache kept from the
    # previous method's run of the same prompt would make the first token free.
    generator.engine.reuse_prefixes(False)
    return generator.reshaped(**draft)


def measure_variants(gen: SpeculativeGenerator, calibrate: bool) -> None:
    """Settle the forward variants before anything is timed. ``calibrate``: measure the
    full curve now. Otherwise, where no measurement chose the variants and the default
    path would measure them in the background after a first answer (see
    :mod:`~ngram_trie_rag.engine.costs.background_measure`), they are measured now, in
    the foreground: a benchmark times what a long-lived process settles on, and no
    measurement may share the cores with its timed runs (plain ``generate`` takes no
    lock that would pause one). Measured, the variants are chosen, so no background
    measurement starts later; where none would, nothing is measured."""
    from ..engine.costs import background_measure

    curve = gen.engine.curve
    measured_by_default = (background_measure.check_setting() and not curve.variants_chosen
                           and background_measure.why_not(gen.model) is None
                           and background_measure.source_folder(gen.model) is not None)
    if calibrate or measured_by_default:
        gen.engine.calibrate()


def warm_up(gen: SpeculativeGenerator, prompts: Sequence[list[int]],
            max_new_tokens: int) -> float:
    """Seconds the engine spends getting ready for requests of ``prompts`` (a compiling
    engine sizes one cache for the longest and compiles its step shapes, so that every
    timed step is a compiled one and compiling is reported apart; 0 for the others)."""
    return gen.engine.warm_up([len(ids) for ids in prompts], max_new_tokens)


def encode_item(gen: SpeculativeGenerator, item: BenchItem) -> list[int]:
    """The row's prompt in the model's form (:meth:`BenchItem.request`), as token ids."""
    return gen.encode_prompt(item.request(gen.tokenizer).prompt)


def rotated(names: Sequence[str], i: int) -> list[str]:
    """``names`` starting at position ``i`` (mod len), wrapping around."""
    k = i % len(names)
    return [*names[k:], *names[:k]]


def answer_text(gen: SpeculativeGenerator, token_ids: list[int],
                stop: Sequence[str] = ()) -> str:
    """An answer's text as a user reads it (special tokens such as EOS left out), up to
    the first stop string. Every method runs to the same token count, as the protocol
    asks, so a base model's stop strings (:class:`~ngram_trie_rag.prompts.RagRequest`)
    cut only the text that is scored, never the tokens that are timed and compared."""
    return before_stop(gen.tokenizer.decode(token_ids, skip_special_tokens=True), stop)


def run_benchmark(cfg: BenchConfig, generator: SpeculativeGenerator | None = None,
                  progress: bool = True) -> dict:
    """Run ``cfg`` and return the ``results.json`` document.

    ``generator`` reuses an already loaded model (its drafting settings are replaced
    by ``cfg``'s); otherwise the model is loaded from ``cfg``.
    """
    items = load_items(cfg.data, cfg.limit)  # before the model: bad data fails fast
    grammar = None
    if cfg.grammar is not None:  # the structured task: its instruction joins every prompt
        grammar, instruction = bench_grammar(cfg.grammar)
        items = [it.with_instruction(instruction) for it in items]
    reference_method = cfg.reference
    draft = {"n": cfg.n, "prefix_len": cfg.prefix_len}
    if cfg.num_draft is not None:  # pinned per call; also the generator's own setting
        draft["num_draft"] = cfg.num_draft
    gen = load_generator(cfg, generator, **draft)
    measure_variants(gen, cfg.calibrate)
    prompts = [encode_item(gen, it) for it in items]
    runners = make_runners(gen, cfg.methods, cfg.num_draft, cfg.pld_num_tokens,
                           cfg.pld_max_ngram, grammar, cfg.repetition_stop)

    compile_s = warm_up(gen, prompts, cfg.max_new_tokens)
    for _ in range(cfg.warmup):  # first-call costs (allocations, thread pools), not recorded
        for fn in runners.values():
            fn(prompts[0], items[0].documents, min(WARMUP_TOKENS, cfg.max_new_tokens), 0.0)

    runs: dict[str, list[Run]] = {m: [] for m in cfg.methods}
    records = []
    bar = tqdm(list(zip(items, prompts, strict=True)), desc="bench", unit="prompt",
               disable=not progress)
    for i, (item, ids) in enumerate(bar):
        compile_s += warm_up(gen, [ids], cfg.max_new_tokens)
        prefill = measure_prefill(gen, ids)  # vanilla always runs: it is the reference
        done: dict[str, Run] = {}
        for name in rotated(cfg.methods, i):
            done[name] = runners[name](ids, item.documents, cfg.max_new_tokens, prefill)
        reference = done[reference_method].token_ids
        oracle = oracle_accept_length(ids, reference)
        for run in done.values():
            run.exact = run.token_ids == reference
            run.oracle = oracle if run.exact else oracle_accept_length(ids, run.token_ids)
            if run.draft_sizes is not None and run.accept_lengths is not None:
                # the model's tokens: a grammar's closing ones were not verified
                model_made = run.token_ids[:run.extra.get("closed_at") or len(run.token_ids)]
                run.same_size_bound = sum(same_size_bounds(ids, model_made,
                                                           run.accept_lengths, run.draft_sizes))
            if item.answers:
                stop = item.request(gen.tokenizer).stop
                run.quality = score(answer_text(gen, run.token_ids, stop), item.answers)
        for name in cfg.methods:
            runs[name].append(done[name])
        capped = {k: oracle_accept_length(ids, reference, k) for k in ORACLE_MAX_DRAFT}
        records.append(_record(i, item, ids, prefill, oracle, capped, done, cfg.methods))
        bar.set_postfix({m: f"{r.new_tokens / r.total_s:.1f}t/s" for m, r in done.items()})
    bar.close()

    lengths = [r.new_tokens for r in runs[reference_method]]
    oracle_mean = pooled_oracle([r["oracle_accept_length"] for r in records], lengths)
    by_draft = {str(k): pooled_oracle([r["oracle_by_max_draft"][str(k)] for r in records],
                                      lengths) for k in ORACLE_MAX_DRAFT}
    meta = environment(gen) | {
        "command": command_line(cfg.command),
        "data": str(cfg.data),
        "rows_used": len(items),
        "row_shape": sorted({it.shape for it in items}),
        "max_new_tokens": cfg.max_new_tokens,
        "methods": list(cfg.methods),
        "reference": reference_method,
        "grammar": cfg.grammar,
        "repetition_stop": cfg.repetition_stop,
        "warmup": cfg.warmup,
        "compile_s": compile_s,  # a compiled engine's shapes, compiled before the timing
        "latency_curve": gen.latency_curve.source,  # measured, refined or probed (default)
        # whether a full measurement chose the forward variants (else the stock ones ran)
        "variants_chosen": gen.latency_curve.variants_chosen,
        "background_load": cfg.background_load,  # processes spinning beside the run
        "drafter": {"n": cfg.n, "prefix_len": cfg.prefix_len, "num_draft": cfg.num_draft,
                    "generator_config": dataclasses.asdict(gen.config)},
        "hf_pld": {"prompt_lookup_num_tokens": cfg.pld_num_tokens,
                   "max_matching_ngram_size": cfg.pld_max_ngram},
        "oracle_accept_length": oracle_mean,
        "oracle_by_max_draft": by_draft,
    }
    methods = {m: summarise(runs[m], runs[reference_method], oracle_mean)
               for m in cfg.methods}
    return {"meta": meta, "methods": methods, "prompts": records}


def _record(i: int, item: BenchItem, ids: list[int], hf_prefill: float, oracle: float,
            capped: dict[int, float], done: dict[str, Run], order: Sequence[str]) -> dict:
    """One prompt's entry; the reference answer ids are kept for offline re-analysis."""
    return {
        "index": i,
        "id": item.id,
        "shape": item.shape,
        "answers": list(item.answers) if item.answers is not None else None,
        "prompt_tokens": len(ids),
        "documents": len(item.documents) if item.documents is not None else None,
        "hf_prefill_s": hf_prefill,
        "oracle_accept_length": oracle,
        "oracle_by_max_draft": {str(k): v for k, v in capped.items()},
        "order": rotated(order, i),
        "reference_ids": done[order[0]].token_ids,  # methods start with the reference
        "methods": {m: done[m].to_dict() for m in order},
    }
