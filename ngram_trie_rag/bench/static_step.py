"""What a tree verification step costs once the step has a fixed shape and is compiled.

The eager step is bound by dispatch on a GPU (each of ~1,400 kernels launched from
Python), so its cost curve says little about the arithmetic of verifying a tree. This
measures the step the static engine is built around: Transformers' own modules over a
:class:`~transformers.StaticCache` (preallocated, never moved), ``1 + K`` query rows at
positions ``past + depth``, a boolean ancestor mask over the whole cache, the argmax
taken in the same graph, and ``torch.compile(fullgraph=True, dynamic=False)`` per ``K``
(``mode="reduce-overhead"``, CUDA graphs, on CUDA). Each point is the median time of the
whole step from inputs to the argmax on the host (one sync), eager and compiled side by
side, with the compiled argmax checked against the eager one.

Random weights built on the device from :data:`cost_curve.SHAPES`, nothing downloaded;
``shape+int4`` (or ``+int8``) quantizes them first (:mod:`~ngram_trie_rag.engine.quant`),
the step cost of quantized weights beside the float ones.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..engine.costs.latency import sync_device
from ..engine.kv_cache import cache_kwargs
from .cost_curve import draft_tree, median_ms, random_model

SIZES = (0, 16, 32, 64)  # draft nodes K; 0 is the plain step


@dataclass(frozen=True)
class StaticPoint:
    """One step shape: ``draft`` nodes after ``context`` tokens, ``engine`` eager or compiled."""

    shape: str
    context: int
    draft: int
    engine: str  # "eager" or "compiled"
    ms: float  # median milliseconds per step, argmax read on the host
    ratio: float  # ms over the same engine's plain step at this context
    compile_s: float  # first call (tracing and compiling); 0 for eager
    agrees: float  # share of rows whose argmax equals the eager step's


def tree_mask(parents: np.ndarray, context: int, length: int) -> torch.Tensor:
    """(1, 1, 1+K, length) bool: every row sees the context and its ancestors in the tree;
    the root row is the last accepted token, node i is row i+1; slots past the tree are
    stale and masked."""
    rows = 1 + len(parents)
    mask = np.zeros((rows, length), dtype=bool)
    mask[:, :context] = True
    for row in range(rows):
        node = row - 1
        mask[row, context + row] = True
        while node >= 0:
            mask[row, context + 1 + node] = True  # an ancestor's own row
            node = int(parents[node])
        mask[row, context] = True  # the root
    return torch.from_numpy(mask)[None, None]


@torch.inference_mode()
def measure(shape: str, *, device: torch.device, dtype: torch.dtype, context: int,
            sizes: tuple[int, ...] = SIZES, warmup: int = 3, repeats: int = 10,
            seed: int = 0, compile_budget_s: float = float("inf")) -> list[StaticPoint]:
    """Eager and compiled points for one shape (``name`` or ``name+scheme``) and context.
    Sizes whose compile would start after ``compile_budget_s`` seconds are skipped (a
    bounded session)."""
    from transformers import StaticCache

    name, _, scheme = shape.partition("+")
    model = random_model(name, device, dtype)
    if scheme:
        from ..engine.quant import check_scheme, quantize_model

        model = quantize_model(model, check_scheme(scheme))
    vocab = model.config.vocab_size
    length = context + 1 + max(sizes)
    cache = StaticCache(config=model.config, max_cache_len=length)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rng = np.random.default_rng(seed)
    prompt = torch.randint(0, vocab, (1, context), generator=gen).to(device)
    model(input_ids=prompt, **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1)
    layers = cache.layers
    kv = cache_kwargs(model, cache)

    def forward(ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=ids, position_ids=pos, attention_mask=mask, **kv,
                       use_cache=True).logits
        return logits[0].argmax(-1)  # (1+K,)

    torch._dynamo.reset()  # one code object serves every shape: start its cache afresh
    compiled = torch.compile(forward, fullgraph=True, dynamic=False,
                             mode="reduce-overhead" if device.type == "cuda" else None)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit,
                                                 2 * len(sizes))

    def inputs(size: int) -> tuple[torch.Tensor, ...]:
        tree = draft_tree("tree", size, rng) if size else None
        parents = tree.parents if tree is not None else np.zeros(0, dtype=np.int64)
        depths = tree.depths if tree is not None else np.zeros(0, dtype=np.int64)
        pos = torch.from_numpy(np.concatenate([[0], depths]) + context)[None].to(device)
        ids = torch.randint(0, vocab, (1, 1 + size), generator=gen).to(device)
        return ids, pos, tree_mask(parents, context, length).to(device)

    def run(fn, args) -> np.ndarray:
        out = fn(*args).cpu().numpy()  # the step's one sync
        for layer in layers:  # back to the context (the compaction's length reset)
            layer.cumulative_length.fill_(context)
        return out

    points: list[StaticPoint] = []
    started = time.perf_counter()
    plain: dict[str, float] = {}
    for size in sorted(sizes):
        args = inputs(size)
        reference = run(forward, args)
        eager = median_ms(lambda args=args: run(forward, args), device, warmup, repeats)
        plain.setdefault("eager", eager)
        points.append(StaticPoint(shape, context, size, "eager", eager,
                                  eager / plain["eager"], 0.0, 1.0))
        if time.perf_counter() - started > compile_budget_s:
            print(f"static {shape} K={size}: compile skipped (budget)", flush=True)
            continue
        sync_device(device)
        start = time.perf_counter()
        first = run(compiled, args)
        compile_s = time.perf_counter() - start
        ms = median_ms(lambda args=args: run(compiled, args), device, warmup, repeats)
        agrees = float((run(compiled, args) == reference).mean())
        plain.setdefault("compiled", ms)
        points.append(StaticPoint(shape, context, size, "compiled", ms,
                                  ms / plain["compiled"], compile_s, agrees))
        print(f"static {shape} ctx={context} K={size}: eager {eager:.2f} ms, compiled "
              f"{ms:.2f} ms (compile {compile_s:.1f} s, first-call rows equal "
              f"{float((first == reference).mean()):.2f}, agree {agrees:.2f})", flush=True)
    return points


def table(points: list[StaticPoint]) -> str:
    """Markdown: one row per point."""
    lines = ["| shape | context | K | engine | ms/step | vs plain | compile s | argmax agrees |",
             "|---|---|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p.shape} | {p.context} | {p.draft} | {p.engine} | {p.ms:.2f} | "
                     f"{p.ratio:.2f}x | {p.compile_s:.1f} | {p.agrees:.2f} |")
    return "\n".join(lines)


def as_json(points: list[StaticPoint]) -> list[dict]:
    return [asdict(p) for p in points]
