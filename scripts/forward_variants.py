"""Which CPU forward variants of the eager engine pay: one verification forward, timed.

For one model (the packaged default, or random weights in the default model's
dimensions shaped as another family), one forward of ``q`` new tokens after
``--past`` cached ones (a plain step for q = 1, a chain draft with its tree mask
otherwise, built and run as the latency curve does, :class:`_ForwardTimer`), in each
variant the eager engine can run:

    a   the modules as shipped (no variant installed): stock layout, stock attention
    a'  the modules with both variants installed, neither switched on (what the
        engine's modules run when the curve picks stock)
    b   modules, packed GQA attention (gqa_attention)
    c   modules, transposed linear layout (linear_layout), q <= 17
    bc  modules, transposed layout and packed GQA, q <= 17
    d   the direct Llama step, stock layout (a draft's GQA is always packed there)
    e   the Llama step, transposed layout
    f   the Llama step, prepacked layout (oneDNN copies of the weights)
    g   the Llama step with a plain step's GQA packed too (same code as d for q > 1)
    h   the compiled static engine's step: its plain step (q = 1) and its 16-node
        bucket (q = 17), cache sized for a 512-token prompt and 64 new tokens

Every variant of one (threads, q) cell runs once to warm up, then ``--repeats`` times,
interleaved (the order rotating each round): the table gives the minimum and the
median, and each variant's minimum over that of ``a``. Before and after every cell the
script records the load average, the busiest processes and the share of the CPUs other
processes took during the cell (from /proc/stat, this process's own time subtracted).
On a shared host it first waits for other processes to fall under ``--quiet-below``
percent of the CPUs (at most ``--quiet-wait`` seconds), and runs a cell during which
they took more again (``--attempts``), keeping the calmest attempt.

Then the thread governor: plain steps through the eager engine's ``run`` (which asks the
governor for each step's thread count) against the same step on a fixed two and one
threads, in alternating blocks.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/forward_variants.py
    HF_HUB_OFFLINE=1 .venv/bin/python scripts/forward_variants.py --family qwen2
    HF_HUB_OFFLINE=1 .venv/bin/python scripts/forward_variants.py --no-compiled --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ngram_trie_rag.drafting import DraftTree
from ngram_trie_rag.engine.costs.latency import MAX_TRANSPOSED, LatencyCurve, _ForwardTimer
from ngram_trie_rag.engine.cpu import gqa_attention, linear_layout, llama_step
from ngram_trie_rag.engine.cpu.forward import forward
from ngram_trie_rag.engine.cpu.thread_governor import free_cores, intra_op_threads
from ngram_trie_rag.engine.eager import EagerEngine
from ngram_trie_rag.engine.models.attention_windows import attention_windows

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compiled_families import shaped  # noqa: E402 - random default-size family shapes

WIN = 0.90  # a variant "wins" where its time is at most this share of stock modules'
ORDER = ("a", "a'", "b", "c", "bc", "d", "e", "f", "g", "h")
LABELS = {
    "a": "a   modules, stock",
    "a'": "a'  modules, variants installed, off",
    "b": "b   modules + packed GQA",
    "c": "c   modules + transposed",
    "bc": "bc  modules + transposed + packed GQA",
    "d": "d   Llama step, stock",
    "e": "e   Llama step, transposed",
    "f": "f   Llama step, prepacked",
    "g": "g   Llama step + packed GQA",
    "h": "h   compiled static engine step",
}


# ---- the host ---------------------------------------------------------------------------
def _cpu_jiffies() -> tuple[int, int]:
    """(busy, steal) jiffies of all CPUs together, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return user + nice + system + irq + softirq, steal


def _own_jiffies() -> int:
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime, every thread


def _top(n: int = 4) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pcpu,pid,args", "--sort=-pcpu"], capture_output=True,
                         text=True, check=False).stdout.splitlines()
    return [line.strip()[:90] for line in out[1:1 + n]]


class HostWatch:
    """Load readings around one measurement: the load average and the busiest
    processes before and after, and what others took of the CPUs in between."""

    def __init__(self, label: str) -> None:
        self.label = label

    def __enter__(self) -> HostWatch:
        self.load_before = Path("/proc/loadavg").read_text().strip()
        self.top_before = _top()
        self.t0 = time.perf_counter()
        self.busy0, self.steal0 = _cpu_jiffies()
        self.own0 = _own_jiffies()
        return self

    def __exit__(self, *exc) -> None:
        busy, steal = _cpu_jiffies()
        own = _own_jiffies()
        elapsed = time.perf_counter() - self.t0
        tick = os.sysconf("SC_CLK_TCK")
        capacity = elapsed * tick * (os.cpu_count() or 1)
        others = max(0, (busy - self.busy0) - (own - self.own0)) / capacity
        steal_share = (steal - self.steal0) / capacity
        self.others = others
        self.summary = (f"{self.label}: {elapsed:.1f} s; loadavg before [{self.load_before}] "
                        f"after [{Path('/proc/loadavg').read_text().strip()}]; other "
                        f"processes {100 * others:.1f}% of the CPUs, steal "
                        f"{100 * steal_share:.1f}%")
        self.top_after = _top()
        LOG.append(self.summary)
        LOG.append("    top before: " + " | ".join(self.top_before))
        LOG.append("    top after:  " + " | ".join(self.top_after))
        print(self.summary, flush=True)


LOG: list[str] = []


def others_share(seconds: float = 3.0) -> float:
    """The share of the CPUs other processes use over ``seconds`` (this one sleeps)."""
    busy0, _ = _cpu_jiffies()
    own0 = _own_jiffies()
    time.sleep(seconds)
    busy, _ = _cpu_jiffies()
    used = max(0, (busy - busy0) - (_own_jiffies() - own0))
    return used / (seconds * os.sysconf("SC_CLK_TCK") * (os.cpu_count() or 1))


def wait_quiet(below: float, limit: float) -> float:
    """Wait (at most ``limit`` seconds) until two looks in a row find other processes
    under ``below`` of the CPUs; the last look's share."""
    start, calm = time.perf_counter(), 0
    share = others_share()
    while time.perf_counter() - start < limit:
        calm = calm + 1 if share < below else 0
        if calm >= 2:
            break
        share = others_share()
    return share


# ---- models -----------------------------------------------------------------------------
def load(family: str | None) -> torch.nn.Module:
    """A fresh model object: the packaged default in fp32, or a random family shape
    (the same weights every call: the seed is fixed)."""
    if family is None:
        from ngram_trie_rag.loading import load_model

        return load_model(None, dtype="float32")[0]
    return shaped(family)


# ---- the compiled static engine ----------------------------------------------------------
class CompiledSteps:
    """The compiled static engine's plain step and 16-node bucket step after a
    ``past``-token prompt. Each timing prepares its step first, as a request does (the
    engine's inputs are views of one staging buffer, valid until the next prepare), and
    times the forward alone; nothing is committed, and the cache's write position is put
    back after each run, so every run writes the same rows."""

    def __init__(self, model: torch.nn.Module, past: int, new_tokens: int = 64) -> None:
        from ngram_trie_rag.engine.static_engine import StaticEngine

        self.engine = StaticEngine(model, compiled=True, background=False, buckets=(16,))
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, model.config.vocab_size, (past,), generator=gen).tolist()
        self.capacity = self.engine.capacity_for(past, new_tokens)
        start = time.perf_counter()
        if not self.engine.compile_for(self.capacity):
            raise RuntimeError("the static engine did not compile")
        self.compile_s = time.perf_counter() - start
        self.kv, logits = self.engine.prefill(ids, capacity=self.capacity)
        if not self.kv.compiled:
            raise RuntimeError("the prefilled request does not run compiled")
        self.last = int(logits.argmax())
        draft = torch.randint(0, model.config.vocab_size, (16,), generator=gen).tolist()
        self.trees = {1: DraftTree.empty(), 17: DraftTree.chain(draft)}

    def seconds(self, q: int) -> float:
        with torch.inference_mode():
            inputs = self.engine.prepare(self.kv, self.last, self.trees[q])
            start = time.perf_counter()
            self.engine.run(self.kv, inputs)
            took = time.perf_counter() - start
            # the cache's write position moved past the step's rows: back to the prefix,
            # as a commit sets it (else the runs walk off the end of the cache)
            for layer in self.kv.cache.layers:
                layer.cumulative_length.fill_(self.kv.length)
        return took


# ---- the variants -----------------------------------------------------------------------
def variants(pristine, installed, past: int, step_applies: bool, compiled: CompiledSteps | None
             ) -> tuple[list[_ForwardTimer], dict[str, tuple[Callable, Callable[[int], bool]]]]:
    """name -> (seconds(q, inputs), applies(q)), and the timers (each with its cache)."""
    windows = attention_windows(pristine.config)
    plain = _ForwardTimer(pristine, None, windows, past)
    inst = _ForwardTimer(installed, None, windows, past)
    timers = [plain, inst]
    out: dict[str, tuple[Callable, Callable[[int], bool]]] = {}

    def timed(timer: _ForwardTimer, layout: str, pack: bool) -> Callable:
        return lambda q, inputs: timer.seconds(inputs, layout, pack)

    def every(q: int) -> bool:
        return True

    def few(q: int) -> bool:
        return q <= MAX_TRANSPOSED

    out["a"] = (timed(plain, "stock", False), every)
    out["a'"] = (timed(inst, "stock", False), every)
    if gqa_attention.installed(installed):
        out["b"] = (timed(inst, "stock", True), every)
    if linear_layout.installed(installed):
        out["c"] = (timed(inst, "transposed", False), few)
        if gqa_attention.installed(installed):
            out["bc"] = (timed(inst, "transposed", True), few)
    if step_applies:
        stepped = _ForwardTimer(pristine, llama_step.for_model(pristine), windows, past)
        timers.append(stepped)
        out["d"] = (timed(stepped, "stock", False), every)
        out["e"] = (timed(stepped, "transposed", False), every)
        if linear_layout.prepack_applies(pristine):
            out["f"] = (timed(stepped, "prepacked", False), every)
        out["g"] = (timed(stepped, "stock", True), every)
    if compiled is not None:
        out["h"] = (lambda q, inputs: compiled.seconds(q), lambda q: q in compiled.trees)
    return timers, out


def measure(timers: list[_ForwardTimer], table: dict, qs: list[int], repeats: int,
            threads: int, quiet: tuple[float, float, int]
            ) -> tuple[dict[tuple[str, int], list[float] | None], dict[int, float]]:
    """Every applicable variant per q: one warm-up, then ``repeats`` interleaved runs
    (None: the variant failed). The first timer draws the inputs every variant runs.

    ``quiet = (below, wait, attempts)``: before a cell, wait up to ``wait`` seconds for
    other processes to use under ``below`` of the CPUs; a cell during which they used
    more is run again, up to ``attempts`` times, and the calmest attempt kept. Returns
    the timings and, per q, the share other processes took during the kept attempt."""
    timer = timers[0]
    below, wait, attempts = quiet
    results: dict[tuple[str, int], list[float] | None] = {}
    calm: dict[int, float] = {}
    for q in qs:
        inputs = timer.inputs(q)
        names = [n for n, (_, applies) in table.items() if applies(q)]
        best: tuple[float, dict] | None = None
        for attempt in range(attempts):
            if wait > 0:
                wait_quiet(below, wait)
            cell: dict[tuple[str, int], list[float] | None] = {}
            with HostWatch(f"threads {threads}, q {q:2d}, {len(names)} variants x "
                           f"{repeats + 1} runs, attempt {attempt + 1}") as watch:
                for run in range(repeats + 1):
                    shift = run % len(names)
                    for name in names[shift:] + names[:shift]:
                        if (name, q) in cell and cell[name, q] is None:
                            continue
                        try:
                            took = table[name][0](q, inputs)
                        except (RuntimeError, NotImplementedError, ValueError) as error:
                            for t in timers:
                                t.drop_appended()
                            print(f"  {name} q={q} cannot run here: {error}", flush=True)
                            cell[name, q] = None
                            continue
                        if run:
                            cell.setdefault((name, q), []).append(took)
            if best is None or watch.others < best[0]:
                best = (watch.others, cell)
            if watch.others < below:
                break
        assert best is not None
        calm[q] = best[0]
        results.update(best[1])
    return results, calm


def print_tables(results: dict, qs: list[int], threads: int, names: list[str],
                 calm: dict[int, float]) -> None:
    print(f"\n### {threads} thread(s): ms per forward, min of the runs (ratio to a's min)\n")
    print("other processes' share of the CPUs while each column ran: "
          + ", ".join(f"q={q} {100 * calm[q]:.0f}%" for q in qs) + "\n")
    print("| variant | " + " | ".join(f"q={q}" for q in qs) + " | wins >=10% at |")
    print("|---|" + "---|" * (len(qs) + 1))
    for name in names:
        cells, wins = [], []
        for q in qs:
            times = results.get((name, q))
            base = results.get(("a", q))
            if not times:
                cells.append("-" if times is None and (name, q) not in results else "fails")
                continue
            ratio = min(times) / min(base)
            cells.append(f"{1000 * min(times):.1f} ({ratio:.2f}x)")
            if ratio <= WIN and name != "a":
                wins.append(f"q={q}")
        print(f"| {LABELS[name]} | " + " | ".join(cells) + f" | {', '.join(wins) or 'none'} |")
    print(f"\n### {threads} thread(s): median ms per forward (ratio to a's median)\n")
    print("| variant | " + " | ".join(f"q={q}" for q in qs) + " |")
    print("|---|" + "---|" * len(qs))
    for name in names:
        cells = []
        for q in qs:
            times = results.get((name, q))
            if not times:
                cells.append("-")
                continue
            med = statistics.median(times)
            cells.append(f"{1000 * med:.1f} ({med / statistics.median(results['a', q]):.2f}x)")
        print(f"| {LABELS[name]} | " + " | ".join(cells) + " |")
    print(flush=True)


# ---- the thread governor ----------------------------------------------------------------
def governor(model: torch.nn.Module, past: int, seconds_1: float, blocks: int,
             steps: int, quiet: tuple[float, float, int]) -> None:
    """Plain steps through the eager engine's run (the governor picks each step's
    threads) against the same forward on fixed 2 and 1 threads, in alternating blocks,
    after ``past`` cached tokens (each step's appended row dropped again)."""
    curve = LatencyCurve({1: seconds_1, 17: 2 * seconds_1}, {}, pack_single=False)
    engine = EagerEngine(model, curve=curve)  # pinned: nothing probed or stored
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (past,), generator=gen).tolist()
    kv, logits = engine.prefill(ids)
    inputs = engine.prepare(kv, int(logits.argmax()), DraftTree.empty())

    def drop() -> None:
        for layer in kv.cache.layers:
            layer.keys = layer.keys[:, :, :past]
            layer.values = layer.values[:, :, :past]

    def fixed(n: int) -> float:
        with torch.inference_mode(), intra_op_threads(n):
            start = time.perf_counter()
            forward(model, engine.step, inputs.ids, inputs.positions, inputs.mask, kv.cache,
                    inputs.layout, inputs.packed)
            took = time.perf_counter() - start
        drop()
        return took

    def governed() -> tuple[float, int]:
        before = dict(getattr(kv, "threads_used", {}))
        with torch.inference_mode():
            start = time.perf_counter()
            engine.run(kv, inputs)
            took = time.perf_counter() - start
        drop()
        if hasattr(engine, "last_threads"):
            return took, engine.last_threads
        after = kv.threads_used  # steps per thread count: the one that grew ran this one
        return took, next(n for n, c in after.items() if c > before.get(n, 0))

    for _ in range(3):  # warm-up
        fixed(2)
        fixed(1)
    if quiet[1] > 0:
        wait_quiet(quiet[0], quiet[1])
    first_free = free_cores(2)  # what the engine's first step reads
    runs: dict[str, list[float]] = {"governor": [], "fixed 2": [], "fixed 1": []}
    by_count: dict[int, list[float]] = {}
    picks: list[int] = []
    with HostWatch(f"governor, {blocks} x 3 blocks of {steps} plain steps") as watch:
        for _ in range(blocks):
            for _ in range(steps):
                took, n = governed()
                runs["governor"].append(took)
                by_count.setdefault(n, []).append(took)
                picks.append(n)
            runs["fixed 2"] += [fixed(2) for _ in range(steps)]
            runs["fixed 1"] += [fixed(1) for _ in range(steps)]
    gov = engine.governor
    print("\n### Thread governor: plain step (engine's variant: "
          f"{'Llama step' if engine.step is not None else 'modules'}, layout "
          f"{inputs.layout}, packed {inputs.packed}), torch threads 2; other processes "
          f"took {100 * watch.others:.0f}% of the CPUs meanwhile\n")
    print(f"free_cores(2) before the first step: {first_free}; the governor's first count: "
          f"{picks[0]}; final count: {gov.current}; switches {gov.switches}; "
          f"mean ratios {({k: round(v, 2) for k, v in gov.mean.items()})}")
    print("steps per count: " + ", ".join(f"{n} threads: {len(v)} (median "
                                          f"{1000 * statistics.median(v):.1f} ms)"
                                          for n, v in sorted(by_count.items())))
    print("\n| run | steps | min ms | median ms | mean ms |")
    print("|---|---|---|---|---|")
    for name, times in runs.items():
        print(f"| {name} | {len(times)} | {1000 * min(times):.1f} | "
              f"{1000 * statistics.median(times):.1f} | {1000 * statistics.fmean(times):.1f} |")
    print(flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", choices=("qwen2", "mistral", "gemma3", "llama"), default=None,
                   help="random weights in the default model's dimensions (default: the "
                        "packaged default model itself)")
    p.add_argument("--past", type=int, default=512)
    p.add_argument("--q", default="1,9,17,33", help="forward sizes, comma-separated")
    p.add_argument("--threads", default="2,1", help="torch threads, comma-separated")
    p.add_argument("--repeats", type=int, default=9, help="timed runs per variant and cell")
    p.add_argument("--no-compiled", action="store_true", help="leave out the compiled step")
    p.add_argument("--quiet-below", type=float, default=10.0, metavar="PERCENT",
                   help="other processes' share of the CPUs a measurement waits for")
    p.add_argument("--quiet-wait", type=float, default=300.0, metavar="SECONDS",
                   help="the longest wait for that before each measurement (0: none)")
    p.add_argument("--attempts", type=int, default=3,
                   help="runs of a measurement during which others took more, at most")
    p.add_argument("--no-governor", action="store_true")
    p.add_argument("--governor-blocks", type=int, default=6)
    p.add_argument("--governor-steps", type=int, default=24)
    args = p.parse_args()
    qs = [int(x) for x in args.q.split(",")]
    thread_counts = [int(x) for x in args.threads.split(",")]
    started = time.perf_counter()
    name = args.family or "packaged default model (fp32)"
    print(f"model: {name}; past {args.past} tokens; q {qs}; threads {thread_counts}; "
          f"{args.repeats} timed runs per cell after one warm-up; torch {torch.__version__}",
          flush=True)

    pristine, installed = load(args.family), load(args.family)
    cfg = pristine.config
    print(f"{type(pristine).__name__}: {cfg.num_hidden_layers} layers, hidden "
          f"{cfg.hidden_size}, heads {cfg.num_attention_heads}/{cfg.num_key_value_heads}, "
          f"vocab {cfg.vocab_size}", flush=True)
    step_applies = llama_step.applies(pristine)
    if gqa_attention.applies(installed):
        gqa_attention.install(installed)
    if linear_layout.applies(installed):
        linear_layout.install(installed)
    print(f"Llama step applies: {step_applies}; packed GQA applies: "
          f"{gqa_attention.installed(installed)}; prepacked applies: "
          f"{step_applies and linear_layout.prepack_applies(pristine)}", flush=True)

    compiled = None
    if not args.no_compiled and 2 in thread_counts:
        torch.set_num_threads(2)  # the compiled kernels keep the count they were built with
        try:
            with HostWatch("compiling the static engine (plain + 16-node bucket)"):
                compiled = CompiledSteps(load(args.family), args.past)
            print(f"compiled in {compiled.compile_s:.0f} s; cache {compiled.capacity} "
                  f"positions; transposed rows {sorted(compiled.engine.transposed_rows)}",
                  flush=True)
        except Exception as error:  # report and go on with the eager variants
            print(f"compiled static engine left out: {type(error).__name__}: {error}",
                  flush=True)
            compiled = None

    seconds_1 = None
    for threads in thread_counts:
        torch.set_num_threads(threads)
        timers, table = variants(pristine, installed, args.past, step_applies,
                                 compiled if threads == 2 else None)
        results, calm = measure(timers, table, qs, args.repeats, threads,
                                (args.quiet_below / 100, args.quiet_wait, args.attempts))
        names = [n for n in ORDER if n in table]
        print_tables(results, qs, threads, names, calm)
        engine_variant = "d" if step_applies else "a'"
        if threads == 2 and results.get((engine_variant, 1)):
            seconds_1 = min(results[engine_variant, 1])

    if not args.no_governor:
        target = pristine if step_applies else installed  # as Engine sets the model up
        if seconds_1 is None:
            torch.set_num_threads(2)
            timer = _ForwardTimer(target, llama_step.for_model(target) if step_applies
                                  else None, attention_windows(target.config), args.past)
            seconds_1 = min(timer.fastest(1, [("stock", False)], 3).values())
        governor(target, args.past, seconds_1, args.governor_blocks, args.governor_steps,
                 (args.quiet_below / 100, args.quiet_wait, args.attempts))

    print("### Load readings\n")
    for line in LOG:
        print(line)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
