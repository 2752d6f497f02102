"""The compiled static engine across model families: exactness, then speed.

``--check`` (tiny random models of every family in the tests' architecture matrix):
per family, the compiled engine's ``plain``, ``chain`` and ``trie`` tokens (both step
shapes' linear layers in the transposed layout) against the
eager static engine's plain decoding (must be identical) and against
``generate(do_sample=False)`` (reported: compiled kernels may round differently), with
the seconds the two shapes took to compile.

``--speed`` (random weights in the default model's dimensions, Llama-, Qwen2-, Mistral-
and Gemma-3-shaped): plain decoding's ms per token through the eager engine (today's
path: the direct Llama step or the model's modules), the static engine run eagerly and
compiled (shapes compiled before the timing), beside the time of the model's linear
layers alone in the modules' own layout (one ``F.linear`` per weight), and the layouts
each engine ran: the eager engine's for a plain step (from its latency curve), and the
row counts whose compiled linear layers run transposed (measured when it compiles).

    HF_HUB_OFFLINE=1 python scripts/compiled_families.py --check
    HF_HUB_OFFLINE=1 python scripts/compiled_families.py --speed --threads 2
    HF_HUB_OFFLINE=1 python scripts/compiled_families.py --speed --only qwen2 --profile

``--profile`` adds, per shape, torch's operator table over 20 compiled plain steps: how
much of a step is matrix products (the weight reads) and how much everything else.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch._inductor.config
import transformers as tf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from model_families import (  # noqa: E402 - the tests' helpers
    FAMILIES,
    build,
    drafting_documents,
    random_prompt,
    word_tokenizer,
)

from ngram_trie_rag import SpeculativeGenerator  # noqa: E402
from ngram_trie_rag.bench.cost_curve import median_ms  # noqa: E402
from ngram_trie_rag.drafting import DraftTree  # noqa: E402
from ngram_trie_rag.engine import EagerEngine, LatencyCurve  # noqa: E402
from ngram_trie_rag.engine.static_engine import StaticEngine  # noqa: E402
from ngram_trie_rag.reference import greedy_reference  # noqa: E402

FLAT = LatencyCurve({q: 0.01 for q in (1, 2, 3, 5, 9, 17, 33)}, {}, pack_single=False)


def check(names: list[str], new_tokens: int) -> None:
    agree = 0
    for name in names:
        model = build(FAMILIES[name])
        eager = SpeculativeGenerator(model, word_tokenizer(), engine=StaticEngine(
            model, compiled=False, buckets=(4,), curve=FLAT))
        # both step shapes' linear layers transposed, whatever tiny weights measure
        engine = StaticEngine(model, compiled=True, buckets=(4,), curve=FLAT,
                              transposed_rows=(1, 5))
        compiled = SpeculativeGenerator(model, word_tokenizer(), engine=engine)
        ids = random_prompt(80, seed=3)
        plain = eager.generate(ids, max_new_tokens=new_tokens, method="none").token_ids
        docs = drafting_documents(plain, seed=3)
        start = time.perf_counter()
        if not engine.compile_for(engine.capacity_for(len(ids), new_tokens)):
            print(f"{name:18s} did not compile (see above)", flush=True)
            continue
        compile_s = time.perf_counter() - start
        reference = greedy_reference(model, ids, new_tokens)
        verdicts = []
        for method, num_draft in (("none", None), ("chain", 3), ("trie", 4)):
            got = compiled.generate(ids, documents=docs, max_new_tokens=new_tokens,
                                    method=method, num_draft=num_draft).token_ids
            verdicts.append((method, got == plain, got == reference))
        same = all(v[1] for v in verdicts)
        agree += same
        print(f"{name:18s} compiled == eager plain: "
              + ", ".join(f"{m} {'yes' if s else 'NO'}" for m, s, _ in verdicts)
              + "; == generate: " + ", ".join(f"{m} {'yes' if g else 'no'}"
                                             for m, _, g in verdicts)
              + f"; compiled 2 shapes in {compile_s:.0f} s", flush=True)
    print(f"compiled plain, chain and trie equal eager plain decoding on {agree} of "
          f"{len(names)} families")


def shaped(kind: str) -> torch.nn.Module:
    """A random model of ``kind`` in the default model's dimensions (fp32, eval)."""
    from ngram_trie_rag.loading import default_model_dir

    base = tf.AutoConfig.from_pretrained(default_model_dir())
    dims = {k: getattr(base, k) for k in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
        "rms_norm_eps", "tie_word_embeddings")}
    configs = {
        "llama": lambda: tf.LlamaConfig(**dims),
        "qwen2": lambda: tf.Qwen2Config(**dims),
        "mistral": lambda: tf.MistralConfig(**dims, sliding_window=None),
        "gemma3": lambda: tf.Gemma3TextConfig(**dims, head_dim=dims["hidden_size"]
                                              // dims["num_attention_heads"],
                                              sliding_window=512),
    }
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(configs[kind]())
    model.set_attn_implementation("sdpa")
    return model.eval()


@torch.inference_mode()
def linear_floor_ms(model: torch.nn.Module, repeats: int) -> float:
    """One (1, in) @ W.T per linear layer (the output head included): the weight reads
    of a one-token step with nothing else."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(1, m.in_features) for m in layers]

    def once() -> None:
        for m, x in zip(layers, inputs, strict=True):
            torch.nn.functional.linear(x, m.weight)

    return median_ms(once, torch.device("cpu"), warmup=1, repeats=repeats)


def decode_ms(gen: SpeculativeGenerator, ids: list[int],
              new_tokens: int) -> tuple[float, list[int]]:
    """Decode ms per token of one plain answer (prefill excluded), and its tokens."""
    result = gen.generate(ids, max_new_tokens=new_tokens, method="none", repetition_stop=None)
    return 1000 * result.stats.decode_s / max(len(result.token_ids) - 1, 1), result.token_ids


def plain_step(engine: EagerEngine, kv, logits: torch.Tensor) -> torch.Tensor:
    """One bare plain step (prepare, forward, argmax, commit): the next logits."""
    inputs = engine.prepare(kv, int(logits.argmax()), DraftTree.empty())
    logits = engine.run(kv, inputs)[0]
    engine.commit(kv, inputs, [])
    return logits


@torch.inference_mode()
def step_ms(engine: EagerEngine, ids: list[int], steps: int) -> float:
    """Median ms of the engine's bare plain step (prepare, forward, argmax, commit)."""
    kv, logits = engine.prefill(ids, steps + 1)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        logits = plain_step(engine, kv, logits)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


@torch.inference_mode()
def operator_profile(engine: EagerEngine, ids: list[int], steps: int = 20) -> str:
    """Torch's operators over ``steps`` bare plain steps, by self CPU time."""
    kv, logits = engine.prefill(ids, steps + 1)
    with torch.profiler.profile() as prof:
        for _ in range(steps):
            logits = plain_step(engine, kv, logits)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)


def speed(kinds: list[str], prompt_len: int, new_tokens: int, repeats: int,
          profile: bool = False) -> None:
    from transformers import AutoTokenizer

    from ngram_trie_rag.loading import default_model_dir

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    print(f"threads {torch.get_num_threads()}, prompt {prompt_len} tokens, "
          f"{new_tokens} new tokens, median of {repeats}")
    print("| shape | eager engine ms/token (bare step) | static, eager | static, compiled | "
          "compiled vs eager engine | linear layers alone | eager engine / floor | "
          "compile s | compiled tokens == eager engine's | layouts (eager engine's "
          "plain step; compiled rows transposed) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind in kinds:
        model = shaped(kind)
        ids = random_prompt(prompt_len, seed=1, vocab_size=model.config.vocab_size)
        twin = shaped(kind)  # the same weights: the eager engine switches modules in place
        eager = SpeculativeGenerator(twin, tokenizer, engine=EagerEngine(twin))
        # plain decoding runs one shape; the smallest bucket is the only other one compiled
        static = SpeculativeGenerator(model, tokenizer, engine=StaticEngine(model, buckets=(1,)))
        engine = StaticEngine(model, compiled=True, buckets=(1,))
        compiled = SpeculativeGenerator(model, tokenizer, engine=engine)
        start = time.perf_counter()
        if not engine.compile_for(engine.capacity_for(prompt_len, new_tokens)):
            print(f"| {kind} | did not compile (see above) |", flush=True)
            continue
        compile_s = time.perf_counter() - start
        gens = {"eager": eager, "static": static, "compiled": compiled}
        runs: dict[str, list[float]] = {name: [] for name in gens}
        steps: dict[str, list[float]] = {name: [] for name in gens}
        tokens = {}
        for _ in range(repeats):  # interleaved, so a change in the host hits every engine
            for name, gen in gens.items():
                ms, tokens[name] = decode_ms(gen, ids, new_tokens)
                runs[name].append(ms)
                steps[name].append(step_ms(gen.engine, ids, new_tokens))
        ms = {name: statistics.median(v) for name, v in runs.items()}
        step = {name: statistics.median(v) for name, v in steps.items()}
        floor = linear_floor_ms(model, 20)
        print(f"| {kind} | {ms['eager']:.1f} ({step['eager']:.1f}) | {ms['static']:.1f} "
              f"({step['static']:.1f}) | {ms['compiled']:.1f} ({step['compiled']:.1f}) | "
              f"{ms['eager'] / ms['compiled']:.2f}x ({step['eager'] / step['compiled']:.2f}x) "
              f"| {floor:.1f} | {ms['eager'] / floor:.2f}x | {compile_s:.0f} | "
              f"{tokens['compiled'] == tokens['eager']} | {eager.engine.curve.layout(1)}; "
              f"{sorted(engine.transposed_rows)} |", flush=True)
        if profile:
            print(f"\n{kind}, compiled, 20 plain steps:\n{operator_profile(engine, ids)}",
                  flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="the tiny architecture matrix")
    p.add_argument("--speed", action="store_true", help="default-size shapes, timed")
    p.add_argument("--only", default="", help="comma-separated families or shapes")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=None)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--profile", action="store_true",
                   help="--speed: also each shape's operator table, compiled")
    p.add_argument("--inductor", default="", metavar="NAME=VALUE,...",
                   help="Inductor options to set first, e.g. cpp_wrapper=1,cpp.threads=1")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for option in filter(None, args.inductor.split(",")):
        name, _, value = option.partition("=")
        *path, leaf = name.split(".")  # e.g. cpp.threads=1
        target = torch._inductor.config
        for part in path:
            target = getattr(target, part)
        old = getattr(target, leaf)
        setattr(target, leaf, value == "1" if isinstance(old, bool) else int(value))
    only = [x for x in args.only.split(",") if x]
    if args.check:
        check(only or sorted(FAMILIES), args.new_tokens or 24)
    if args.speed:
        speed(only or ["llama", "qwen2", "mistral", "gemma3"], args.prompt_len,
              args.new_tokens or 64, args.repeats, args.profile)
    if not (args.check or args.speed):
        p.error("say --check, --speed or both")


if __name__ == "__main__":
    main()
