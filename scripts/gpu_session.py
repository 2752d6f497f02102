"""Everything a GPU host should measure, in one process per part, results under OUT.

    python3 scripts/gpu_session.py --out OUT --parts env,curve,smoke        # random weights
    python3 scripts/gpu_session.py --out OUT --parts bench --gguf model.gguf  # real weights
    python3 scripts/gpu_session.py --out OUT --device cpu --quick --parts env,curve,smoke

Parts:
- ``env``: torch, transformers, the device and its driver (``env.json``).
- ``curve``: :mod:`ngram_trie_rag.bench.cost_curve` for the shapes users run, bf16 on
  CUDA (``curve.json``, ``curve.md``).
- ``smoke``: the SmolLM2-135M shape with random weights and the real tokenizer, fp32:
  ``vanilla``, ``chain`` and ``trie`` through the benchmark harness, whose exact-match
  column is the check (``smoke.json``). Needs ``--meta`` (config and tokenizer files).
- ``profile``: where a bf16 step's time goes, ``generate`` against the engine's plain and
  trie steps (``profile.txt``), with ``--gguf``'s weights or else ``--meta``'s random ones.
- ``compiled``: ``generate`` with a static cache (compiled by Transformers on CUDA),
  per-token time of the first (compiling) and later calls (``compiled.json``).
- ``static``: :mod:`ngram_trie_rag.bench.static_step`, the fixed-shape compiled tree
  step against the eager one over a static cache, bf16 on CUDA (``static.json``,
  ``static.md``), within ``--deadline`` seconds of the script's start; the 8B Llama shape
  with int4 weights too (``llama-3.1-8b+int4``: the quantized step's cost against bf16).
- ``tests``: the tests marked ``gpu`` (``make test-gpu``), with ``--gguf``'s weights when
  given, else random weights in ``--meta``'s shape (``tests.txt``).
- ``report``: every result in ``OUT`` gathered into ``report.md`` and ``report.json``.
- ``bench``: the packaged model's GGUF, fp32 (exactness: ``vanilla``, ``chain``,
  ``trie``) then bf16 (every method) on Spec-Bench RAG (``fp32.json``, ``bf16.json``);
  then ``vanilla``, ``plain`` and ``trie`` through ``--engine uniform-compiled`` in both
  (``fp32-uniform-compiled.json``, ``bf16-uniform-compiled.json``).
- ``agreement``: the packaged model, bf16, ``--engine uniform-compiled``: on 40 Spec-Bench
  RAG prompts, whether ``plain``, ``chain`` and ``trie`` give the same tokens and which
  equal bf16 ``generate`` (``agreement.json``, ``scripts/method_agreement.py``).
- ``bucketed``: the packaged model through ``--engine compiled`` (trees padded to 1-64
  nodes, seven shapes), fp32 (``vanilla``, ``plain``, ``chain``, ``trie``) and bf16
  (``vanilla``, ``plain``, ``trie``): every shape compiled first (``warm_up_s``), then,
  once the file ``--after`` names exists, the benchmark (``fp32-compiled.json``,
  ``bf16-compiled.json``). ``--dtypes`` picks them. Compiling uses the CPU, so it can run
  beside another part's GPU work; ``--after`` keeps the timed runs from overlapping it.

- ``serving``: ``bench-serve --methods local,local-trie`` (the local server's continuous
  batching, each request its own documents' trie) with ``--gguf``'s weights on
  Spec-Bench RAG at 1, 4, 16 and 64 users, fp32 (exactness against ``local``) then bf16
  (``serving-fp32.json``, ``serving-bf16.json``). Not in the default parts: ``--only
  serving`` (the shell script) or ``--parts serving``.
- ``quantized``: ``bench --quantize int8`` and ``int4`` with ``vanilla`` and ``trie``, fp32
  (exactness against the quantized model's own ``generate``) then bf16
  (``quantized-int8-float32.json``, ...), then int4 bf16 through ``uniform-compiled``
  (``quantized-int4-bfloat16-uniform-compiled.json``, against ``bf16-uniform-compiled.json``).
  Not in the default parts: ``--parts quantized``.

TF32 stays off (PyTorch's default for matrix products), so fp32 is fp32.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ngram_trie_rag.bench import cost_curve  # noqa: E402
from ngram_trie_rag.commands.cli import main as cli  # noqa: E402
from ngram_trie_rag.engine.costs.latency import sync_device  # noqa: E402
from ngram_trie_rag.util.cache_paths import data_dir  # noqa: E402

STARTED = time.perf_counter()
CURVE_SHAPES = ("smollm2-135m", "llama-3.2-1b", "llama-3.1-8b", "qwen2.5-7b")
#: the bucketed part's runs by dtype: (file name prefix, methods, prompts)
BUCKETED = {"float32": ("fp32", "vanilla,plain,chain,trie", 5),
            "bfloat16": ("bf16", "vanilla,plain,trie", 10)}


def env(out: Path, device: torch.device) -> None:
    import transformers

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "device": str(device),
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {"gpu": props.name, "sms": props.multi_processor_count,
                 "memory_gib": round(props.total_memory / 2**30, 1),
                 "cuda": torch.version.cuda, "capability": list(torch.cuda.get_device_capability())}
    else:
        info["cpu_threads"] = torch.get_num_threads()
    (out / "env.json").write_text(json.dumps(info, indent=1))
    print("env:", json.dumps(info))


def curve(out: Path, device: torch.device, quick: bool) -> None:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes = ("tiny-llama",) if quick else CURVE_SHAPES
    kwargs = (dict(contexts=(64, 128), sizes=(1, 4, 16), warmup=1, repeats=2) if quick
              else {})
    points = []
    for shape in shapes:
        start = time.perf_counter()
        points += cost_curve.measure(shape, device=device, dtype=dtype, **kwargs)
        print(f"curve {shape}: {time.perf_counter() - start:.1f} s", flush=True)
        _save(out, "curve", device, cost_curve.as_json(points), cost_curve.table(points))
    print(cost_curve.table(points), flush=True)


def _save(out: Path, name: str, device: torch.device, rows: list[dict], text: str) -> None:
    """After each shape: the memory back for the next, the results so far on disk."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    (out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    (out / f"{name}.md").write_text(text + "\n")


def random_folder(meta: Path, quick: bool) -> Path:
    """The default model's config and tokenizer with random weights, saved as a folder."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"ngt-random-smollm2{'-quick' * quick}"
    if (folder / "model.safetensors").is_file():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(meta, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.gguf"))
    config = AutoConfig.from_pretrained(folder)
    if quick:
        config.num_hidden_layers = 2
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:2]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def smoke(out: Path, device: torch.device, quick: bool, meta: Path, data: Path) -> None:
    """Random weights in the default model's shape: exactness mechanics on the device."""
    _bench(out / "smoke.json", random_folder(meta, quick), data, device, "float32",
           "vanilla,chain,trie", limit=2 if quick else 6, tokens=16 if quick else 64)


def bench(out: Path, device: torch.device, quick: bool, gguf: Path, data: Path) -> None:
    """The default engine (exactness in fp32, every method in bf16), then the one-shape
    compiled engine (its step compiled once before the timing, CUDA graphs on CUDA)."""
    _bench(out / "fp32.json", gguf, data, device, "float32", "vanilla,chain,trie",
           limit=2 if quick else 10, tokens=16 if quick else 128)
    _bench(out / "bf16.json", gguf, data, device, "bfloat16",
           "vanilla,hf-pld,plain,chain,trie", limit=2 if quick else 12,
           tokens=16 if quick else 128)
    for dtype, name, limit in (("float32", "fp32", 5), ("bfloat16", "bf16", 10)):
        _bench(out / f"{name}-uniform-compiled.json", gguf, data, device, dtype,
               "vanilla,plain,trie", limit=1 if quick else limit, tokens=8 if quick else 128,
               engine="uniform-compiled")


def serving(out: Path, device: torch.device, quick: bool, gguf: Path, data: Path) -> None:
    """Continuous batching through the local server, fp32 then bf16, in one process per
    method (``bench-serve``); the server loads onto the default device (CUDA here)."""
    from ngram_trie_rag.loading import converted_gguf_dir

    model = converted_gguf_dir(gguf)  # bench-serve reads a folder's tokenizer
    for dtype, name in (("float32", "fp32"), ("bfloat16", "bf16")):
        code = cli(["bench-serve", "--data", str(data), "--model", str(model),
                    "--dtype", dtype, "--methods", "local,local-trie",
                    "--limit", "2" if quick else "12",
                    "--max-new-tokens", "8" if quick else "128",
                    "--concurrency", "1,2" if quick else "1,4,16,64",
                    "--out", str(out / f"serving-{name}.json")])
        if code:
            raise RuntimeError(f"bench-serve ({dtype}) exited {code}")


def agreement(out: Path, device: torch.device, quick: bool, gguf: Path, data: Path) -> None:
    """The one-shape compiled engine's bf16 agreement across methods and with generate."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from method_agreement import agreement as measure

    from ngram_trie_rag import SpeculativeGenerator

    gen = SpeculativeGenerator.from_pretrained(gguf, device=device, dtype="bfloat16",
                                               engine="uniform-compiled")
    summary = measure(gen, data, limit=2 if quick else 40, max_new_tokens=8 if quick else 64,
                      generate=True)
    summary |= {"engine": "uniform-compiled", "dtype": "bfloat16", "device": str(device)}
    (out / "agreement.json").write_text(json.dumps(summary, indent=1))


def bucketed(out: Path, device: torch.device, quick: bool, gguf: Path, data: Path,
             after: Path | None, dtypes: str) -> None:
    """``--engine compiled`` on real weights: compile every shape (timed apart), wait for
    ``after``, then benchmark, per dtype in ``dtypes``."""
    from ngram_trie_rag import SpeculativeGenerator
    from ngram_trie_rag.bench.config import BenchConfig
    from ngram_trie_rag.bench.data import load_items
    from ngram_trie_rag.bench.report import bench_table, write_json
    from ngram_trie_rag.bench.runner import encode_item, run_benchmark, warm_up

    for dtype in dtypes.split(","):
        name, methods, limit = BUCKETED[dtype]
        limit, tokens = (1, 8) if quick else (limit, 128)
        gen = SpeculativeGenerator.from_pretrained(gguf, device=device, dtype=dtype,
                                                   engine="compiled")
        start = time.perf_counter()
        warm_up_s = warm_up(gen, [encode_item(gen, it)
                                              for it in load_items(data, limit)], tokens)
        print(f"bucketed {name}: {len(gen.engine.step_sizes())} shapes compiled in "
              f"{warm_up_s:.1f} s", flush=True)
        while after is not None and not after.exists():
            time.sleep(1)
        cfg = BenchConfig(data=str(data), limit=limit, max_new_tokens=tokens, model=str(gguf),
                          device=device.type, dtype=dtype, engine="compiled",
                          methods=tuple(methods.split(",")))
        results = run_benchmark(cfg, generator=gen, progress=False)
        results["warm_up_s"] = warm_up_s  # before the run; its own compile_s is what was left
        write_json(results, out / f"{name}-compiled.json")
        print(bench_table(results), flush=True)  # the log keeps the figures too
        print(f"bucketed {name}: {time.perf_counter() - start:.1f} s", flush=True)
        del gen
        if device.type == "cuda":
            torch.cuda.empty_cache()


def profile(out: Path, device: torch.device, quick: bool, model: Path, data: Path) -> None:
    """Where a decoding step's time goes: ``generate`` against the engine's plain and trie
    steps, bf16, one prompt (cProfile's top functions and torch's top operators).
    ``model``: the GGUF, or random weights (the time does not depend on them)."""
    import cProfile
    import io
    import pstats

    from ngram_trie_rag import SpeculativeGenerator

    gen = SpeculativeGenerator.from_pretrained(model, device=device, dtype="bfloat16")
    prompt = json.loads(data.read_text().splitlines()[0])["turns"][0]
    tokens = 16 if quick else 64
    ids = gen.tokenizer(prompt, return_tensors="pt").to(device)

    def vanilla() -> None:
        gen.model.generate(**ids, max_new_tokens=tokens, do_sample=False, min_new_tokens=tokens)

    runs = {"vanilla": vanilla,
            "plain": lambda: gen.generate(prompt, [prompt], method="none",
                                          max_new_tokens=tokens),
            "trie": lambda: gen.generate(prompt, [prompt], method="trie",
                                         max_new_tokens=tokens)}
    report = io.StringIO()
    for name, run in runs.items():
        run()  # warm-up (and the engine's first-use work)
        sync_device(device)
        start = time.perf_counter()
        run()
        sync_device(device)
        print(f"profile {name}: {(time.perf_counter() - start) * 1e3 / tokens:.1f} ms/token",
              flush=True)
        prof = cProfile.Profile()
        prof.enable()
        run()
        sync_device(device)
        prof.disable()
        report.write(f"\n== {name}: cProfile, top 25 by total time\n")
        pstats.Stats(prof, stream=report).sort_stats("tottime").print_stats(25)
        with torch.profiler.profile() as tp:
            run()
            sync_device(device)
        report.write(f"\n== {name}: torch operators, top 20 by self CPU time\n")
        report.write(tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    (out / "profile.txt").write_text(report.getvalue())


def compiled(out: Path, device: torch.device, quick: bool, model_dir: Path, data: Path) -> None:
    """Hugging Face's fastest greedy configuration: ``generate`` with a static cache, which
    Transformers compiles on CUDA. First call (compiling) and later calls, bf16."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
    prompt = json.loads(data.read_text().splitlines()[0])["turns"][0]
    ids = tokenizer(prompt, return_tensors="pt").to(device)
    tokens = 16 if quick else 64
    times = {}
    for label, cache in (("dynamic", None), ("static-1st", "static"), ("static-2nd", "static"),
                         ("static-3rd", "static")):
        sync_device(device)
        start = time.perf_counter()
        model.generate(**ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                       cache_implementation=cache)
        sync_device(device)
        times[label] = (time.perf_counter() - start) * 1e3 / tokens
        print(f"compiled {label}: {times[label]:.1f} ms/token", flush=True)
    (out / "compiled.json").write_text(json.dumps(times, indent=1))


def static(out: Path, device: torch.device, quick: bool, deadline: float, spec: str) -> None:
    from ngram_trie_rag.bench import static_step

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    runs = ((("tiny-llama", 64, (0, 4, 16)), ("tiny-llama+int8", 64, (0, 4))) if quick else
            (("smollm2-135m", 1024, static_step.SIZES), ("llama-3.1-8b", 2048, static_step.SIZES),
             ("llama-3.1-8b+int4", 2048, static_step.SIZES),
             ("qwen2.5-7b", 2048, static_step.SIZES)))
    if spec:  # "shape:context:k,k,..;shape:context:k,.."
        runs = tuple((shape, int(context), tuple(int(k) for k in sizes.split(",")))
                     for shape, context, sizes in (run.split(":") for run in spec.split(";")))
    points = []
    for shape, context, sizes in runs:
        left = deadline - (time.perf_counter() - STARTED)
        if left < 60:
            print(f"static {shape}: skipped, {left:.0f} s left", flush=True)
            continue
        points += static_step.measure(shape, device=device, dtype=dtype, context=context,
                                      sizes=sizes, warmup=1 if quick else 3,
                                      repeats=3 if quick else 10, compile_budget_s=left - 60)
        _save(out, "static", device, static_step.as_json(points), static_step.table(points))
    print(static_step.table(points), flush=True)


def _bench(result: Path, model: Path, data: Path, device: torch.device, dtype: str,
           methods: str, limit: int, tokens: int, engine: str = "auto",
           extra: tuple[str, ...] = ()) -> None:
    start = time.perf_counter()
    code = cli(["bench", "--data", str(data), "--model", str(model), "--device", device.type,
                "--dtype", dtype, "--methods", methods, "--limit", str(limit),
                "--max-new-tokens", str(tokens), "--engine", engine, "--no-progress",
                "--out", str(result), *extra])
    print(f"{result.name}: exit {code}, {time.perf_counter() - start:.1f} s", flush=True)


def quantized(out: Path, device: torch.device, quick: bool, gguf: Path, data: Path) -> None:
    """``bench --quantize int8`` and ``int4`` (``vanilla``, ``trie``), fp32 (exactness
    against the quantized model's own ``generate``) then bf16, beside the ``bench`` part's
    unquantized runs (``quantized-int4-bfloat16.json``, ...)."""
    limit, tokens = (1, 16) if quick else (8, 128)
    for scheme in ("int8", "int4"):
        for dtype in ("float32", "bfloat16"):
            _bench(out / f"quantized-{scheme}-{dtype}.json", gguf, data, device, dtype,
                   "vanilla,trie", limit, tokens, extra=("--quantize", scheme))
    # compiled int4 in bf16 (fp32 refuses it), against the uniform part's compiled bf16
    _bench(out / "quantized-int4-bfloat16-uniform-compiled.json", gguf, data, device,
           "bfloat16", "vanilla,trie", limit, tokens, engine="uniform-compiled",
           extra=("--quantize", "int4"))


def gpu_tests(out: Path, model: Path | None, select: str = "") -> None:
    """The tests marked ``gpu`` (what ``make test-gpu`` runs), with ``model`` (the GGUF,
    or a folder of random weights) instead of the packaged model when given, only those
    pytest's ``-k`` expression ``select`` names when given; pytest's report in
    ``tests.txt``. Where there is no CUDA every test skips with its reason."""
    import subprocess

    env = {**os.environ, "NGRAM_TRIE_RAG_TEST_GPU": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                      os.environ.get("PYTHONPATH")]))}
    if model is not None:
        env["NGRAM_TRIE_RAG_TEST_MODEL"] = str(model)
    report = out / "tests.txt"  # written as the tests run: a host that stops keeps it
    with report.open("w") as log:  # faulthandler: a stuck test's stacks after 240 s
        done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                               "-rs", "-o", "faulthandler_timeout=240", "--durations=10",
                               "-m", "gpu", *(["-k", select] if select else []),
                               str(ROOT / "tests" / "gpu")],
                              env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                              cwd=ROOT)
    print(report.read_text()[-3000:], flush=True)
    if done.returncode not in (0, 5):  # 5: nothing collected to run
        raise RuntimeError(f"gpu tests failed (exit {done.returncode}): see tests.txt")


def report(out: Path) -> None:
    """One report of every part's results in ``out``: ``report.md`` (each part's table
    or text, in order) and ``report.json`` (each part's JSON)."""
    order = ["env", "tests", "static", "curve", "smoke", "compiled", "profile", "fp32", "bf16",
             "fp32-uniform-compiled", "bf16-uniform-compiled", "agreement", "fp32-compiled",
             "bf16-compiled"]
    found = sorted({f.stem for f in out.iterdir() if f.suffix in (".json", ".md", ".txt")}
                   - {"report"}, key=lambda n: (order.index(n) if n in order else 99, n))
    sections, data = [f"# GPU session: {out.name}"], {}
    for name in found:
        body = [f.read_text() for f in (out / f"{name}.md", out / f"{name}.txt") if f.is_file()]
        js = out / f"{name}.json"
        if js.is_file():
            data[name] = json.loads(js.read_text())
            if not body:
                body = ["```json\n" + js.read_text()[:4000] + "\n```"]
        sections.append(f"## {name}\n\n" + "\n".join(body).strip())
    (out / "report.md").write_text("\n\n".join(sections) + "\n")
    (out / "report.json").write_text(json.dumps(data, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny sizes (a CPU check of the code)")
    p.add_argument("--parts", default="env,curve,smoke,bench")
    p.add_argument("--meta", type=Path, default=None,
                   help="folder with the default model's config and tokenizer files")
    p.add_argument("--gguf", type=Path, default=None, help="the default model's GGUF file")
    p.add_argument("--deadline", type=float, default=float("inf"),
                   help="seconds from the start after which the static part starts nothing new")
    p.add_argument("--static-runs", default="",
                   help="static part: 'shape:context:K,K,..;..' instead of the default runs")
    p.add_argument("--tests-k", default="", metavar="EXPR",
                   help="tests part: only the tests this pytest -k expression selects")
    p.add_argument("--after", type=Path, default=None, metavar="FILE",
                   help="bucketed part: benchmark only once FILE exists (compile before)")
    p.add_argument("--dtypes", default="float32,bfloat16", help="bucketed part: dtypes")
    p.add_argument("--data", type=Path, default=data_dir() / "spec_bench" / "rag.jsonl")
    args = p.parse_args()
    unknown = set(args.dtypes.split(",")) - BUCKETED.keys()
    if unknown:
        p.error(f"--dtypes: unknown {', '.join(sorted(unknown))} ({', '.join(BUCKETED)})")
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    for part in args.parts.split(","):
        start = time.perf_counter()
        try:
            if part == "env":
                env(args.out, device)
            elif part == "curve":
                curve(args.out, device, args.quick)
            elif part == "smoke":
                smoke(args.out, device, args.quick, args.meta, args.data)
            elif part == "profile":
                profile(args.out, device, args.quick,
                        args.gguf or random_folder(args.meta, args.quick), args.data)
            elif part == "compiled":
                compiled(args.out, device, args.quick,
                         random_folder(args.meta, args.quick), args.data)
            elif part == "static":
                static(args.out, device, args.quick, args.deadline, args.static_runs)
            elif part == "report":
                report(args.out)
            elif part == "tests":  # random weights in the default shape without a GGUF
                gpu_tests(args.out, args.gguf or (random_folder(args.meta, args.quick)
                                                  if args.meta else None), args.tests_k)
            elif part == "bench":
                bench(args.out, device, args.quick, args.gguf, args.data)
            elif part == "quantized":
                quantized(args.out, device, args.quick, args.gguf, args.data)
            elif part == "serving":
                serving(args.out, device, args.quick, args.gguf, args.data)
            elif part == "agreement":
                agreement(args.out, device, args.quick, args.gguf, args.data)
            elif part == "bucketed":
                bucketed(args.out, device, args.quick, args.gguf, args.data, args.after,
                         args.dtypes)
            else:
                raise SystemExit(f"unknown part {part!r}")
        except Exception as exc:  # one part failing must not cost the others' results
            import traceback

            traceback.print_exc()
            print(f"part {part} FAILED: {exc!r}", flush=True)
        print(f"part {part}: {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
