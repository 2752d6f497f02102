"""What verifying K draft tokens costs, against one plain decoding step.

Speculative decoding pays when a forward over ``1 + K`` query rows costs little more
than a forward over one: on a GPU at 7B-8B parameters that holds up to tens of rows
(the step is bound by reading the weights), on a small model or a CPU it does not. This
measures the ratio at the model shapes users run, with random weights (timings do not
depend on the values) built straight on the device from configs written here, so no
weights are downloaded.

Each point is one forward through the same path the generator takes where no fast path
applies (:func:`~ngram_trie_rag.engine.cpu.forward.forward` with the stock layout), the mask
built by :func:`~ngram_trie_rag.engine.trees.tree_attention.tree_inputs` from a draft tree:
``chain`` (one path of K nodes) or ``tree`` (K nodes under random parents). After each
forward the cache is cut back to the context, so every point sees the same past.
Every shape runs once before any is timed (clocks ramp up, kernels get chosen); times
are medians over ``repeats`` forwards after ``warmup``, the device synchronised around
each one.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..drafting.draft_tree import DraftTree
from ..engine.costs.latency import sync_device
from .cost_shapes import CONTEXTS, DRAFT_SIZES, SHAPES


@dataclass(frozen=True)
class Point:
    """One measured forward: ``draft`` nodes (0 = a plain step) at ``context`` past."""

    shape: str
    context: int
    kind: str  # "plain", "chain" or "tree"
    draft: int
    ms: float  # median milliseconds per forward
    ratio: float  # ms over the plain step's at the same context


def random_model(shape: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A model of ``shape`` with random weights, built directly on ``device``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    arch, fields = SHAPES[shape]
    config = AutoConfig.for_model(arch, max_position_embeddings=8192, **fields)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def draft_tree(kind: str, size: int, rng: np.random.Generator) -> DraftTree:
    """``chain``: one path of ``size`` nodes; ``tree``: each node under a random earlier
    node or the root (pre-order holds: parents precede children)."""
    if kind == "chain":
        parents = np.arange(-1, size - 1)
    else:
        parents = np.array([rng.integers(-1, i) if i else -1 for i in range(size)])
    depths = np.zeros(size, dtype=np.int64)
    for i, p in enumerate(parents):
        depths[i] = 1 if p < 0 else depths[p] + 1
    tokens = rng.integers(0, 100, size)
    return DraftTree(tokens=tokens, parents=parents.astype(np.int64), depths=depths)


def median_ms(fn, device: torch.device, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync_device(device)
        start = time.perf_counter()
        fn()
        sync_device(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


@torch.inference_mode()
def measure(shape: str, *, device: torch.device, dtype: torch.dtype,
            contexts: tuple[int, ...] = CONTEXTS, sizes: tuple[int, ...] = DRAFT_SIZES,
            warmup: int = 3, repeats: int = 10, seed: int = 0) -> list[Point]:
    """Every (context, kind, size) point of one model shape."""
    from transformers import DynamicCache

    from ..engine.cpu.forward import forward
    from ..engine.kv_cache import cache_kwargs
    from ..engine.trees.tree_attention import tree_inputs

    model = random_model(shape, device, dtype)
    vocab = model.config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rng = np.random.default_rng(seed)
    points: list[Point] = []
    for context in contexts:
        cache = DynamicCache(config=model.config)
        prompt = torch.randint(0, vocab, (1, context), generator=gen).to(device)
        model(input_ids=prompt, **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1)

        def step(tree: DraftTree | None, cache=cache, context=context) -> None:
            if tree is None:
                pos = torch.tensor([[context]], device=device)
                mask = None
                ids = torch.randint(0, vocab, (1, 1), generator=gen).to(device)
            else:
                pos, mask = tree_inputs(tree, context, device, dtype)
                ids = torch.randint(0, vocab, (1, 1 + len(tree)), generator=gen).to(device)
            forward(model, None, ids, pos, mask, cache, "stock", False)
            cache.crop(-ids.shape[1])  # back to the context

        trees = {(kind, size): draft_tree(kind, size, rng)
                 for kind in ("chain", "tree") for size in sizes}
        for tree in (None, *trees.values()):  # every shape once: clocks up, kernels chosen
            step(tree)
        plain = median_ms(lambda: step(None), device, warmup, repeats)
        points.append(Point(shape, context, "plain", 0, plain, 1.0))
        for (kind, size), tree in trees.items():
            ms = median_ms(lambda tree=tree: step(tree), device, warmup, repeats)
            points.append(Point(shape, context, kind, size, ms, ms / plain))
    return points  # the model goes with this frame: the next shape has the memory


def table(points: list[Point]) -> str:
    """Markdown: one row per (shape, context, kind), the cost ratio per draft size."""
    sizes = sorted({p.draft for p in points if p.draft})
    head = "| shape | context | kind | plain ms | " + " | ".join(f"K={k}" for k in sizes) + " |"
    lines = [head, "|" + "---|" * (4 + len(sizes))]
    plain = {(p.shape, p.context): p.ms for p in points if p.kind == "plain"}
    rows: dict[tuple[str, int, str], dict[int, float]] = {}
    for p in points:
        if p.kind != "plain":
            rows.setdefault((p.shape, p.context, p.kind), {})[p.draft] = p.ratio
    for (shape, context, kind), ratios in rows.items():
        cells = " | ".join(f"{ratios[k]:.2f}x" if k in ratios else "" for k in sizes)
        lines.append(f"| {shape} | {context} | {kind} | {plain[shape, context]:.2f} | {cells} |")
    return "\n".join(lines)


def as_json(points: list[Point]) -> list[dict]:
    return [asdict(p) for p in points]
