"""What a benchmark or sweep run is asked to do, as plain dataclasses (CLI and Python)."""

from __future__ import annotations

from dataclasses import dataclass

from ..decoding.repetition import check_repetition_stop

#: Every method the harness knows. ``vanilla`` is the reference for speed and exactness;
#: ``plain`` is this library's engine with drafting off, so that a speed-up splits into
#: what the engine's forwards gain and what speculation gains.
METHODS = ("vanilla", "hf-pld", "plain", "chain", "trie")
#: Named, never run by default: ``hf-static`` is ``generate`` over a static cache, which
#: Transformers compiles on a GPU (its fastest greedy configuration there); on a CPU it
#: runs eagerly and only costs time.
OPT_IN_METHODS = ("hf-static",)
REFERENCE = "vanilla"
#: Under a grammar the reference is constrained plain greedy in the same engine (one
#: token a step, same masks); ``vanilla`` and ``hf-pld`` decode unconstrained.
CONSTRAINED_REFERENCE = "plain"
UNCONSTRAINED_ONLY = ("vanilla", "hf-pld", "hf-static")
CONSTRAINED_METHODS = ("plain", "chain", "trie")
#: Drafters that also run with a pinned budget, named ``<drafter>@K`` (e.g. ``trie@8``:
#: the tree drafter verifying up to 8 nodes every step instead of its adaptive budget),
#: so that a budget can be compared with the adaptive one side by side in one run.
PINNABLE = ("chain", "trie")
#: Tree drafters the sweep can tune.
TREE_METHODS = ("trie", "backoff")


@dataclass
class RunConfig:
    """What every run shares: the data, the answer length, and one model for all methods."""

    data: str = ""
    limit: int | None = None  # the first N rows
    max_new_tokens: int = 128
    model: str | None = None  # local HF folder; None = the packaged default
    dtype: str = "float32"  # fp32 by default: greedy exactness needs it on CPU
    device: str | None = None  # None = CUDA when available, else CPU
    threads: int | None = None  # torch.set_num_threads; None leaves torch's default
    warmup: int = 1  # warm-up rounds (one short generation per method each), not recorded
    background_load: int = 0  # CPU-spinning processes running beside the whole run
    calibrate: bool = False  # measure the latency curve first (else the stored or probed one)
    engine: str = "auto"  # one of engine_names.ENGINES (ngram_trie_rag.engine.choice)
    capacity: int | None = None  # cache positions a preallocating engine reserves; None: sized
    quantization: str | None = None  # "int8" / "int4" / "w8a8" (engine.quant); None: as loaded
    command: str | None = None  # the command line, for the record; None = sys.argv

    def __post_init__(self) -> None:
        if not self.data:
            raise ValueError("data (a JSONL file) is required")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.background_load < 0:
            raise ValueError(f"background_load must be >= 0, got {self.background_load}")
        from ..engine.engine_names import check_capacity, check_engine
        from ..engine.quant.names import check_scheme

        check_capacity(self.capacity, check_engine(self.engine))
        check_scheme(self.quantization)
        _check_positive(max_new_tokens=self.max_new_tokens)


@dataclass
class BenchConfig(RunConfig):
    """A Spec-Bench style comparison of decoding methods over one data file."""

    methods: tuple[str, ...] = METHODS
    n: int = 13
    prefix_len: int = 3
    num_draft: int | None = None  # pinned per call; None = the generator's own policy
    pld_num_tokens: int = 10  # prompt_lookup_num_tokens of hf-pld
    pld_max_ngram: int = 3  # max_matching_ngram_size of hf-pld
    grammar: str | None = None  # a preset (bench.grammars) or a JSON-schema file
    repetition_stop: int | None = None  # n: every method ends at its first repeated n-gram

    @property
    def reference(self) -> str:
        """The method every other is compared with."""
        return CONSTRAINED_REFERENCE if self.grammar is not None else REFERENCE

    def __post_init__(self) -> None:
        super().__post_init__()
        self.methods = normalise_methods(self.methods, self.reference)
        if self.grammar is not None:
            bad = [m for m in self.methods if m in UNCONSTRAINED_ONLY]
            if bad:
                raise ValueError(f"{bad} cannot decode under a grammar; with --grammar use "
                                 "plain, chain, trie and pinned drafters")
        _check_positive(pld_num_tokens=self.pld_num_tokens, pld_max_ngram=self.pld_max_ngram)
        self.repetition_stop = check_repetition_stop(self.repetition_stop)
        if self.num_draft is not None:
            _check_positive(num_draft=self.num_draft)
        if self.n <= self.prefix_len or self.prefix_len < 1:
            raise ValueError(f"need n > prefix_len >= 1, got n={self.n}, "
                             f"prefix_len={self.prefix_len}")


@dataclass
class SweepConfig(RunConfig):
    """The paper's hyper-parameter table: an n x L_p grid at a fixed num_draft, and a
    num_draft row at a fixed (n, L_p); ``replay`` derives accept lengths without the model."""

    ns: tuple[int, ...] = (8, 10, 13, 16)
    prefix_lens: tuple[int, ...] = (2, 3, 4, 5)
    num_drafts: tuple[int, ...] = (8, 16, 32, 64, 128, 256)
    fixed_n: int = 13  # n of the num_draft row
    fixed_prefix_len: int = 3  # L_p of the num_draft row
    fixed_num_draft: int = 8  # num_draft of the n x L_p grid
    replay: bool = False
    method: str = "trie"  # the tree drafter: "trie" (paper) or "backoff"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.method not in TREE_METHODS:
            raise ValueError(f"sweep method must be one of {list(TREE_METHODS)}, "
                             f"got {self.method!r}")
        _check_positive(fixed_n=self.fixed_n, fixed_prefix_len=self.fixed_prefix_len,
                        fixed_num_draft=self.fixed_num_draft)
        for name in ("ns", "prefix_lens", "num_drafts"):
            values = tuple(int(v) for v in getattr(self, name))
            if not values or min(values) < 1:
                raise ValueError(f"{name} must be a non-empty list of positive integers")
            setattr(self, name, values)
        if not self.cells():
            raise ValueError("no valid cell: every n must exceed its prefix length L_p")

    def cells(self) -> list[tuple[int, int, int]]:
        """(n, L_p, num_draft) to run: the grid, then the row; invalid pairs (n <= L_p)
        are skipped, duplicates run once."""
        grid = [(n, lp, self.fixed_num_draft) for n in self.ns for lp in self.prefix_lens]
        row = [(self.fixed_n, self.fixed_prefix_len, k) for k in self.num_drafts]
        return list(dict.fromkeys(c for c in grid + row if c[0] > c[1]))


def normalise_methods(methods: str | tuple[str, ...] | list[str],
                      reference: str = REFERENCE) -> tuple[str, ...]:
    """Validate, dedupe, and put the reference first (speed-ups and exactness need it)."""
    names = [m.strip() for m in methods.split(",")] if isinstance(methods, str) else list(methods)
    names = [m for m in names if m]
    known = (*METHODS, *OPT_IN_METHODS)
    unknown = [m for m in names if m not in known and pinned_budget(m) is None]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {list(known)}, "
                         f"or {' / '.join(f'{d}@K' for d in PINNABLE)} for a budget pinned "
                         "at K >= 1 nodes")
    return tuple(dict.fromkeys([reference, *names]))


def pinned_budget(method: str) -> tuple[str, int] | None:
    """``"trie@8"`` -> ``("trie", 8)``; None for anything else."""
    drafter, at, k = method.partition("@")
    if not at or drafter not in PINNABLE or not k.isdigit() or int(k) < 1:
        return None
    return drafter, int(k)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
