"""A hardware-aware draft budget: verify the tree size that maximises tokens per second.

Verifying K draft nodes costs one forward over 1 + K tokens, t(1 + K). On a GPU, or
with bf16 on a CPU, t is nearly flat up to a few dozen tokens; in fp32 on a CPU it
is not (41 / 73 / 91 ms for 1 / 9 / 17 tokens with the default model). So the best K
depends on the hardware and on how often drafts are right:

    K* = argmax_K  AL(K) / t(1 + K)       AL(K): expected tokens per step with top-K

``t`` is measured once per (model, dtype, device, threads) in a process and refined
from the real steps' timings.
``AL(K)`` is learned online, for every K at once: greedy verification reveals the
model's token after each accepted node, so after a step we know how far the
top-K subtree of the ranked candidates would have matched, for any K (a lower bound
when the whole emitted sequence was covered). Ranks increase along a path, so the
top-K subtree accepts exactly the path nodes ranked below K.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch

SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


class DraftBudget:
    """Chooses num_draft per step from a latency curve and observed acceptance."""

    def __init__(self, latency: dict[int, float], max_draft: int, decay: float = 0.95) -> None:
        self.sizes = [k for k in SIZES if k <= max_draft] or [max_draft]
        if max_draft not in self.sizes:
            self.sizes.append(max_draft)
        self.latency = _monotone(latency)  # tokens in the forward (1 + K) -> seconds
        self.decay = decay
        # Optimistic start: assume drafts pay off until the first steps say otherwise.
        self.accept = {k: 1.0 + min(k, 4) * 0.25 for k in self.sizes}

    def cost(self, k: int) -> float:
        """t(1 + k), interpolated linearly between measured sizes."""
        q = 1 + k
        points = sorted(self.latency)
        if q in self.latency:
            return self.latency[q]
        lo = max((p for p in points if p <= q), default=points[0])
        hi = min((p for p in points if p >= q), default=points[-1])
        if hi == lo:
            return self.latency[lo] * q / lo
        w = (q - lo) / (hi - lo)
        return self.latency[lo] * (1 - w) + self.latency[hi] * w

    def record_latency(self, tokens: int, seconds: float) -> None:
        """Refine t(tokens) from a real step (context grows, machines get busy)."""
        if tokens in self.latency:
            self.latency[tokens] = 0.9 * self.latency[tokens] + 0.1 * seconds

    def choose(self) -> int:
        return max(self.sizes, key=lambda k: self.accept[k] / self.cost(k))

    def observe(self, path_ranks: Sequence[int], emitted: int) -> None:
        """Update AL(K) for every K from one verified step.

        ``path_ranks``: ranks of the candidate nodes along the emitted tokens (from
        ``DraftTree.path_ranks`` on the full ranked candidate tree); ``emitted``:
        tokens the step produced (accepted + bonus).
        """
        for k in self.sizes:
            accepted = sum(1 for r in path_ranks if r < k)
            self.accept[k] = self.decay * self.accept[k] + (1 - self.decay) * (accepted + 1)


def latency_curve(model, cache_file: Path | None = None, past_len: int = 512,
                  sizes: Sequence[int] = SIZES, repeats: int = 3) -> dict[int, float]:
    """Seconds per forward of ``1 + K`` new tokens after ``past_len`` cached ones."""
    if cache_file is not None and cache_file.is_file():
        try:
            return {int(q): float(t) for q, t in json.loads(cache_file.read_text()).items()}
        except (ValueError, OSError):
            pass  # unreadable cache: measure again
    from .kv_cache import new_cache

    device = model.device
    vocab = model.config.vocab_size
    past_len = min(past_len, int(getattr(model.config, "max_position_embeddings", 2048)) // 2)
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, past_len), generator=gen).to(device)
    curve: dict[int, float] = {}
    with torch.inference_mode():
        cache = new_cache()
        model(input_ids=prefix, past_key_values=cache, use_cache=True, logits_to_keep=1)
        for q in [1] + [1 + k for k in sizes]:
            ids = torch.randint(0, vocab, (1, q), generator=gen).to(device)
            pos = torch.arange(past_len, past_len + q, device=device)[None]
            best = float("inf")
            for _ in range(repeats + 1):  # the first run warms up this shape
                _sync(device)
                start = time.perf_counter()
                model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
                _sync(device)
                best = min(best, time.perf_counter() - start)
                for layer in cache.layers:  # drop what this forward appended
                    layer.keys = layer.keys[:, :, :past_len]
                    layer.values = layer.values[:, :, :past_len]
            curve[q] = best
    if cache_file is not None:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            cache_file.write_text(json.dumps(curve))
        except OSError:
            pass  # read-only cache: measure again next time
    return curve


def _monotone(curve: dict[int, float]) -> dict[int, float]:
    """A forward of more tokens never costs less: take the running maximum (timing noise)."""
    out, worst = {}, 0.0
    for q in sorted(curve):
        worst = max(worst, curve[q])
        out[q] = worst
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
