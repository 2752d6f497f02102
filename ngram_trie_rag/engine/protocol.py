"""What the decode loop, the benchmark and the command line ask of an engine.

An engine runs one model's forwards for one request at a time: prefill, then per step
one verification forward over ``[last] + tree`` (a plain step when the tree is empty),
acceptance, and the KV cache compacted to the accepted path. How it runs them (the
buffered cache and the CPU variants, or a preallocated cache and compiled steps) stays
behind these verbs; callers outside :mod:`ngram_trie_rag.engine` use nothing else, and
learn what an engine is from :meth:`Engine.describe`, never from its type.

The per-request state (:class:`KV`) and a step's inputs (:class:`StepInputs`) are
defined here too, since both engines hand them out and take them back.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from ..decoding.sampling import SamplingParams
    from ..drafting.draft_tree import DraftTree
    from .acceptance import DeviceTree
    from .costs.latency import LatencyCurve

# a linear layer's product (linear_layout; rowwise: rowwise_linear)
Layout = Literal["stock", "transposed", "prepacked", "rowwise"]


@dataclass
class KV:
    """One request's KV cache. Invariant: ``cache`` holds exactly ``length`` positions,
    the committed sequence except its newest token (fed by the next forward); ``ids``
    are their tokens (to recompute the cache where ``generate`` does)."""

    cache: Any
    length: int
    ids: list[int] = field(default_factory=list)
    reused: int = 0  # prompt rows taken from the previous request's cache
    threads_used: dict[int, int] = field(default_factory=dict)  # CPU threads -> steps
    # what its steps run on, where not the engine's own name (a compiling engine's steps
    # run eagerly until its shapes are ready: "static" or "uniform")
    ran_on: str = ""


@dataclass(frozen=True)
class StepInputs:
    """One verification forward's inputs: ids (1, Q), positions (1, Q), mask (None for
    a plain step), and the variant it runs in."""

    ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor | dict[str, torch.Tensor] | None
    layout: Layout
    packed: bool
    drafted: int  # N, draft nodes in the forward (Q = 1 + N)
    tokens: list[int] = field(default_factory=list)  # [last, *draft tokens]
    recompute: bool = False  # a plain step over the whole sequence, cache rebuilt
    tree: DeviceTree | None = None  # the tree on the device, where the engine keeps it


@dataclass(frozen=True)
class EngineInfo:
    """What an engine is, for reports, stats and answers' metadata.

    ``name``: one of :data:`~ngram_trie_rag.engine.engine_names.ENGINES` (``auto`` only
    for the engine that chooses between two; a request names the one it ran on).
    ``compiled``: its steps run compiled once their shapes are ready. ``forward``: what
    computes a step (``"llama-step"``, the direct Llama step; ``"modules"``, the model's
    own). ``layouts``: forward rows -> linear layout, where not the stock one."""

    name: str
    compiled: bool
    forward: str
    layouts: Mapping[int, Layout] = field(default_factory=dict)

    def label(self) -> str:
        """One line: ``"compiled (modules; transposed at 1, 9 rows)"``."""
        where = ", ".join(f"{lay} at {q}" for q, lay in sorted(self.layouts.items()))
        return f"{self.name} ({self.forward}{'; ' + where if where else ''})"


@runtime_checkable
class Engine(Protocol):
    """The verbs of an engine. ``lock`` is the model's generation lock: every engine
    over one model object shares its weights and compute, so requests hold it."""

    lock: threading.Lock

    def describe(self) -> EngineInfo:
        """Its name, whether it compiles, and the variants it chose."""
        ...

    # ---- the cost curve the draft budget reads ----------------------------------------
    @property
    def curve(self) -> LatencyCurve:
        """Seconds per verification forward by size: this process's, the stored one, or
        a quick probe run now (call it before holding :attr:`lock`)."""
        ...

    def load_curve(self) -> None:
        """Look the curve up (or probe it) now: a request calls this before it holds
        :attr:`lock`, which a probe takes itself."""
        ...

    def stored_curve(self) -> tuple[LatencyCurve | None, Path]:
        """The curve stored for this model on this host (None if none) and its file."""
        ...

    def calibrate(self) -> Path | None:
        """Measure the full curve now and store it; its file (None: not stored)."""
        ...

    def refine_curve(self, seconds: Mapping[int, float]) -> None:
        """Take real steps' timings (forward size -> seconds) into the curve, where the
        engine's curve describes its steps."""
        ...

    # ---- before requests ---------------------------------------------------------------
    def reuse_prefixes(self, enabled: bool) -> None:
        """Whether a prompt reuses the cache rows it shares with the previous request's
        sequence (a benchmark turns it off: every method prefills as ``generate``)."""
        ...

    def warm_up(self, prompt_lengths: Sequence[int], new_tokens: int,
                timeout: float | None = None) -> float:
        """Get ready for requests of these prompt lengths adding at most ``new_tokens``,
        waiting at most ``timeout`` seconds: a compiling engine sizes one cache for the
        longest and compiles its step shapes. Seconds spent (0.0: nothing to do).
        Raises RuntimeError when the shapes could not be made ready."""
        ...

    # ---- a request ---------------------------------------------------------------------
    def choose(self, prompt_len: int, new_tokens: int) -> Engine:
        """The engine that runs a request of ``prompt_len`` tokens adding at most
        ``new_tokens``, from its prefill to its last step: itself, or for an engine
        that chooses (``auto``) one of those it chooses between. The request then calls
        that engine's verbs, and its stats name it."""
        ...

    def finished(self) -> None:
        """A request ended (what an engine may learn from: ``auto`` starts compiling)."""
        ...

    def depth_room(self, past_len: int) -> int:
        """The deepest draft a step at ``past_len`` cached tokens verifies exactly."""
        ...

    def prefill(self, ids: list[int], new_tokens: int | None = None
                ) -> tuple[KV, torch.Tensor]:
        """Cache the prompt: its :class:`KV` and the logits (V,) after its last token.
        ``new_tokens``: the most the request may add."""
        ...

    def prepare(self, kv: KV, last: int, tree: DraftTree) -> StepInputs:
        """Inputs of the forward verifying ``tree`` below ``last``: node i at position
        ``kv.length + depth_i``, seeing the prefix and its own ancestors only."""
        ...

    def run(self, kv: KV, inputs: StepInputs) -> torch.Tensor:
        """Logits (1 + N, V) of one prepared forward; its keys and values join the cache."""
        ...

    def accept(self, inputs: StepInputs, tree: DraftTree, logits: torch.Tensor,
               params: SamplingParams, generator: torch.Generator | None
               ) -> tuple[list[int], list[int]]:
        """``(tokens, path)``: the accepted nodes' tokens plus the bonus token, and their
        query rows (1-based). Reading it waits for the forward: the step's host sync."""
        ...

    def commit(self, kv: KV, inputs: StepInputs, path: list[int]) -> None:
        """Keep the rows of ``last`` and the accepted ``path``; drop rejected branches."""
        ...
