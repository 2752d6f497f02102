"""Greedy exactness of the generator against ``generate(do_sample=False)`` across model
families, on tiny random models built from configs (nothing downloaded).

    HF_HUB_OFFLINE=1 python scripts/check_model_families.py [--lengths 600,3000]
        [--only mistral-window,phi3-window]

Covers the windowed families at long prompts (several windows, and one prompt of
3,000 tokens) and families beyond the test matrix (``tests/test_model_families.py``).
Per family and prompt: whether plain, trie and chain decoding give ``generate``'s
tokens, and how many draft tokens were accepted (the drafting documents hold the
model's own answer and corrupted copies, see ``tests/model_families.py``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from model_families import (  # noqa: E402 - the tests' helpers
    FAMILIES,
    SIZE,
    WINDOW,
    Family,
    accepted,
    build,
    drafting_documents,
    pinned_generator,
    random_prompt,
)

from ngram_trie_rag.reference import greedy_reference  # noqa: E402

MORE = [
    Family("olmo2", tf.Olmo2ForCausalLM, lambda: tf.Olmo2Config(**SIZE)),
    Family("stablelm", tf.StableLmForCausalLM, lambda: tf.StableLmConfig(**SIZE)),
    Family("granite", tf.GraniteForCausalLM, lambda: tf.GraniteConfig(**SIZE)),
    Family("cohere", tf.CohereForCausalLM, lambda: tf.CohereConfig(**SIZE)),
    Family("cohere2-window", tf.Cohere2ForCausalLM,
           lambda: tf.Cohere2Config(**SIZE, sliding_window=WINDOW,
                                    layer_types=["sliding_attention", "full_attention"]),
           WINDOW),
    Family("starcoder2-window", tf.Starcoder2ForCausalLM,
           lambda: tf.Starcoder2Config(**SIZE, sliding_window=WINDOW), WINDOW),
    Family("gemma", tf.GemmaForCausalLM, lambda: tf.GemmaConfig(**SIZE, head_dim=16)),
    Family("gpt-oss-window", tf.GptOssForCausalLM,
           lambda: tf.GptOssConfig(**SIZE, head_dim=16, num_local_experts=4,
                                   num_experts_per_tok=2, sliding_window=WINDOW,
                                   layer_types=["sliding_attention", "full_attention"]),
           WINDOW),
    Family("llama4-chunked", tf.Llama4ForCausalLM,
           lambda: tf.Llama4TextConfig(**SIZE, intermediate_size_mlp=128, head_dim=16,
                                       attention_chunk_size=WINDOW, num_local_experts=2,
                                       layer_types=["chunked_attention", "full_attention"]),
           WINDOW),
]


def check(family: Family, length: int, seed: int) -> str:
    model = build(family)
    ids = random_prompt(length, seed=seed)
    expected = greedy_reference(model, ids, 64)
    docs = drafting_documents(expected)
    gen = pinned_generator(model)
    cells = []
    for method in ("none", "trie", "chain"):
        result = gen.generate(ids, documents=docs, max_new_tokens=64, method=method,
                              num_draft=8)
        exact = "exact" if result.token_ids == expected else "DIFFERS"
        cells.append(f"{method} {exact} ({accepted(result):2d} accepted)")
    return " | ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="600,3000")
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lengths = [int(x) for x in args.lengths.split(",")]
    families = [FAMILIES["mistral-window"], FAMILIES["phi3-window"], *MORE]
    for family in families:
        if args.only and family.name not in args.only.split(","):
            continue
        window = f"window {family.window}" if family.window else "no window"
        for length in lengths:
            for seed in range(3 if length < 1000 else 1):
                start = time.perf_counter()
                try:
                    line = check(family, length, seed)
                except Exception as error:  # noqa: BLE001 - report and go on
                    line = f"ERROR {type(error).__name__}: {error}"
                print(f"{family.name:18s} {window:10s} prompt {length:4d} seed {seed}: {line}"
                      f"  [{time.perf_counter() - start:.1f}s]", flush=True)


if __name__ == "__main__":
    main()
