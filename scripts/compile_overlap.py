"""How long the compiled engine's first answer takes while its shapes compile beside it.

The static engine with a background compile (trees padded to 16 nodes, one cache size)
answers eagerly until its shapes are compiled. Prints the same answer's time through the
eager static engine alone, then beside the compile, then when the compile ended. Run it
in a fresh process with an empty Inductor cache, so that the compile is a cold one:

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) HF_HUB_OFFLINE=1 \\
        .venv/bin/python scripts/compile_overlap.py --switch-interval 0.005

``--switch-interval S`` holds the interpreter's switch interval at S seconds for the
whole run, the compile included (0.005 is Python's default: the engine as it was before
it shortened the interval while compiling); without it the engine does as it does.
"""

from __future__ import annotations

import argparse
import sys
import time

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.engine.compiling import switch_interval
from ngram_trie_rag.engine.static_engine import StaticEngine
from ngram_trie_rag.loading import load_model

CAPACITY = 1024
QUESTION = [{"role": "user", "content": "Explain in detail how a bicycle gear system works."}]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--switch-interval", type=float, default=None,
                   help=f"seconds (default: the engine's own, "
                        f"{switch_interval.COMPILE_SWITCH_INTERVAL_S} while compiling)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    model, tokenizer = load_model(None, device=args.device, dtype="float32")

    def answer(engine: StaticEngine) -> tuple[float, int]:
        gen = SpeculativeGenerator(model, tokenizer, engine=engine, num_draft=16)
        start = time.perf_counter()
        out = gen.generate(QUESTION, max_new_tokens=args.max_new_tokens, method="none")
        return time.perf_counter() - start, len(out.token_ids)

    alone, _ = answer(StaticEngine(model, buckets=(16,), capacity=CAPACITY))
    if args.switch_interval is not None:  # after the warm-up answer, before the compile
        sys.setswitchinterval(args.switch_interval)
        switch_interval.COMPILE_SWITCH_INTERVAL_S = args.switch_interval
    start = time.perf_counter()
    compiled = StaticEngine(model, compiled=True, buckets=(16,), capacity=CAPACITY)
    beside, tokens = answer(compiled)
    if not compiled.compile_for(CAPACITY, timeout=1800):
        raise SystemExit("the shapes did not compile")
    print(f"switch interval {args.switch_interval or 'engine default'}: {tokens} tokens "
          f"alone {alone:.1f} s, beside the compile {beside:.1f} s; compiled after "
          f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
