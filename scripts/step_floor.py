"""How far a CPU decode step is from its floor: what compiling the step could still save.

Prints, for the packaged model in fp32 (or ``--model``):

- the linear layers' bytes, and their products for M rows back to back (M = 1: one
  plain step's weight reads; 5, 9, 17, 33: a tree step's rows), in the stock layout
  and with the weights stored transposed;
- a plain copy of the same bytes (what this host's memory moves);
- the eager engine's whole step (prepare, forward, commit) over a cached prompt, plain
  and with an 8-node chain.

The gap between the one-row products and the plain step is all that fusing the
elementwise work and dropping dispatch (a compiled step) can remove; the products of a
tree step's rows are what they are in either engine.

    .venv/bin/python scripts/step_floor.py --threads 2
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

from ngram_trie_rag.bench.cost_curve import median_ms

CPU = torch.device("cpu")


def timed_ms(fn) -> float:
    """Median of 15 runs after 3 warm-ups."""
    return median_ms(fn, CPU, warmup=3, repeats=15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cached", type=int, default=600, help="prompt tokens cached")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from ngram_trie_rag import SpeculativeGenerator
    from ngram_trie_rag.drafting.draft_tree import DraftTree

    generator = SpeculativeGenerator.from_pretrained(args.model, dtype="float32",
                                                     engine="eager")
    weights = [m.weight for m in generator.model.modules() if isinstance(m, torch.nn.Linear)]
    transposed = [w.t().contiguous() for w in weights]
    size = sum(w.numel() * w.element_size() for w in weights)
    print(f"linear layers: {size / 1e6:.1f} MB, {args.threads} threads")
    for m in (1, 5, 9, 17, 33):
        xs = {w.shape[1]: torch.randn(m, w.shape[1]) for w in weights}
        stock = timed_ms(lambda xs=xs: [F.linear(xs[w.shape[1]], w) for w in weights])
        flipped = timed_ms(lambda xs=xs: [torch.mm(xs[w.shape[0]], w) for w in transposed])
        rate = f" ({size / stock / 1e6:.1f} GB/s)" if m == 1 else ""
        print(f"products of {m:2d} rows: stock {stock:6.1f} ms{rate}, "
              f"transposed {flipped:6.1f} ms")
    source = torch.empty(size // 4)
    target = torch.empty_like(source)
    copy = timed_ms(lambda: target.copy_(source))
    print(f"copy of {size / 1e6:.1f} MB: {copy:.1f} ms "
          f"({2 * size / copy / 1e6:.1f} GB/s read and write)")

    engine = generator.engine
    ids = np.random.default_rng(0).integers(100, 40_000, size=args.cached).tolist()
    kv, _ = engine.prefill(ids)
    for nodes in (0, 8):
        tree = DraftTree.chain(list(range(2, 2 + nodes)))

        def step(tree=tree) -> None:
            inputs = engine.prepare(kv, 5, tree)
            engine.run(kv, inputs)
            engine.commit(kv, inputs, [])  # keeps the one committed token: +1 a step

        print(f"eager engine step, {nodes} draft nodes, {args.cached} cached: "
              f"{timed_ms(step):.1f} ms ({engine.describe().forward})")


if __name__ == "__main__":
    main()
