"""Acceptance: walk the verified tree, on the host or as tensor ops on the device.

Both walks return ``(tokens, path)``: the emitted tokens (accepted draft tokens then the
bonus token) and the accepted node indices (query rows, 1-based; 0 is the root).

:func:`host_walk` branches in Python on every visited node: cheapest on a CPU.
:func:`device_walk` makes every row's choice at once, tests every node against its
parent row's choice, and takes the deepest node whose whole chain matches: the same
greedy result with no data-dependent control flow, so a GPU step needs one transfer at
the end and the greedy path compiles to one graph per tree bucket
(``torch.compile(fullgraph=True)``). Seeded sampling draws differ between the two (the
device draws at every row), each keeping the distribution.
:func:`accept_step` picks the walk for a step: the tree an engine keeps on the device,
else the host walk on a CPU and the device walk elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..decoding.sampling import SamplingParams, choose, probabilities
from ..drafting.draft_tree import DraftTree
from .protocol import StepInputs
from .trees.tree_buckets import PaddedTree, pad_tree


def row_choices(logits: torch.Tensor, params: SamplingParams,
                generator: torch.Generator | None) -> torch.Tensor:
    """(Q, V) logits -> (Q,) int64: the token chosen at every query row.

    Sampling makes one batched draw over all rows. This keeps the output distribution:
    each visited row's token is an independent draw from that row's distribution, and
    draws at rows the walk never visits go unused. A seeded run's random stream differs
    from the host walk's, though, which draws only at the visited rows.
    """
    if params.greedy:
        return torch.argmax(logits, dim=-1)
    probs = probabilities(logits, params)  # (Q, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def packed_size(max_depth: int) -> int:
    """Length of ``accept_on_device``'s result: length, path rows, emitted tokens."""
    return 1 + max_depth + (max_depth + 1)


def accept_on_device(tokens: torch.Tensor, ancestors: torch.Tensor, depths: torch.Tensor,
                     choices: torch.Tensor, max_depth: int) -> torch.Tensor:
    """The accepted path, packed as ``[length, rows (max_depth), emitted (max_depth + 1)]``.

    ``tokens`` (B,) int64 node tokens; ``ancestors`` (Q, Q) bool ancestor-or-self, Q = 1 + B;
    ``depths`` (B,) int64; ``choices`` (Q,) int64 from ``row_choices``. ``max_depth`` must be
    >= the deepest real node (the bucket size always is): it fixes the output shape.
    Unused path rows are 0, unused emitted tokens -1. With distinct sibling tokens at most
    one node per depth can match; if ties arose, the first in pre-order would win.
    """
    q = ancestors.shape[0]
    dev = choices.device
    depth_q = torch.cat((depths.new_zeros(1), depths))  # (Q,) root at depth 0
    node_anc = ancestors[1:]  # (B, Q) ancestors-or-self of each node, root column included
    # A node's parent row is its one ancestor exactly one level up.
    is_parent = node_anc & (depth_q[None, :] == depths[:, None] - 1)  # (B, Q)
    parent_choice = (is_parent.long() * choices[None, :]).sum(-1)  # (B,)
    match = tokens == parent_choice  # (B,)
    ok = ~(node_anc[:, 1:] & ~match[None, :]).any(-1)  # (B,) the whole chain matches
    ok_q = torch.cat((torch.ones(1, dtype=torch.bool, device=dev), ok))  # (Q,) root always
    order = torch.arange(q, device=dev)
    # Deepest first, then earliest in pre-order; not-ok rows rank below the root.
    key = torch.where(ok_q, depth_q * q + (q - 1 - order), -1)  # (Q,)
    best = torch.argmax(key).reshape(1)  # (1,) row of the accepted leaf, 0 = none
    length = depth_q.index_select(0, best)  # (1,)
    on_path = ancestors.index_select(0, best)[0, 1:]  # (B,) nodes on the accepted path
    levels = torch.arange(1, max_depth + 1, device=dev)  # (D,)
    at_level = on_path[None, :] & (depths[None, :] == levels[:, None])  # (D, B)
    rows = (at_level.long() * order[None, 1:]).sum(-1)  # (D,) query rows, 0 unused
    visit = torch.cat((rows.new_zeros(1), rows))  # (D + 1,) root then the path
    used = torch.arange(max_depth + 1, device=dev) <= length  # (D + 1,)
    emitted = torch.where(used, choices.index_select(0, visit), -1)  # (D + 1,)
    return torch.cat((length, rows, emitted))


@dataclass
class DeviceTree:
    """A step's draft tree as the device already holds it (uploaded with the step's ids
    and positions), so acceptance uploads nothing; ``packed`` keeps the result on the
    device for compaction."""

    tokens: torch.Tensor  # (N,) int64, real nodes in pre-order
    ancestors: torch.Tensor  # (1 + N, 1 + N) bool, ancestor-or-self, root row/column 0
    depths: torch.Tensor  # (N,) int64
    max_depth: int  # deepest real node, from the host tree
    packed: torch.Tensor | None = None  # accept_on_device's result, once accepted

    def accept(self, logits: torch.Tensor, params: SamplingParams,
               generator: torch.Generator | None) -> tuple[list[int], list[int]]:
        """``(tokens, path)`` with one device-to-host copy; ``logits`` (1 + N, V)."""
        choices = row_choices(logits, params, generator)
        self.packed = accept_on_device(self.tokens, self.ancestors, self.depths, choices,
                                       self.max_depth)
        return unpack(self.packed.tolist(), self.max_depth)

    def path_rows(self, length: int) -> torch.Tensor:
        """(1 + length,) int64 on the device: row 0 (``last``) and the accepted path's
        query rows, for compaction without an upload."""
        assert self.packed is not None, "accept before compacting"
        return torch.cat((self.packed.new_zeros(1), self.packed[1: 1 + length]))


def unpack(packed: list[int], max_depth: int) -> tuple[list[int], list[int]]:
    """Host side: ``(tokens, path)`` as :func:`host_walk` returns them."""
    length = packed[0]
    path = packed[1: 1 + length]
    start = 1 + max_depth
    return packed[start: start + length + 1], path


def tree_tensors(tree: PaddedTree, device: torch.device | str
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(tokens (B,), ancestors (Q, Q), depths (B,))`` on ``device``."""
    return (torch.as_tensor(tree.tokens, device=device),
            torch.as_tensor(tree.ancestors, device=device),
            torch.as_tensor(tree.depths, device=device))


def device_walk(tree: DraftTree | PaddedTree, logits: torch.Tensor, params: SamplingParams,
                generator: torch.Generator | None) -> tuple[list[int], list[int]]:
    """:func:`host_walk` on the device: ``logits`` (Q, V) with Q = 1 + len(tree)."""
    if isinstance(tree, DraftTree):
        tree = pad_tree(tree, len(tree))
    if logits.shape[0] != 1 + len(tree):
        raise ValueError(f"expected {1 + len(tree)} logit rows, got {logits.shape[0]}")
    return DeviceTree(*tree_tensors(tree, logits.device), tree.max_depth).accept(
        logits, params, generator)


def host_walk(tree: DraftTree, logits: torch.Tensor, params: SamplingParams,
              generator: torch.Generator | None) -> tuple[list[int], list[int]]:
    """Walk the verified tree from the root. ``logits``: (Q, V) for [committed token] +
    nodes. At each row take the model's token (greedy) or a draw from its distribution;
    descend where a child holds it, else emit it as the bonus token and stop."""
    children = tree.children()
    if params.greedy:
        # One host transfer for the whole tree instead of one per visited node.
        choices = torch.argmax(logits, dim=-1).tolist()
        pick = choices.__getitem__
    else:
        def pick(row: int) -> int:
            return choose(logits[row], params, generator)

    tokens: list[int] = []
    path: list[int] = []
    row = 0
    while True:
        tok = pick(row)
        tokens.append(tok)
        child = children[row].get(tok)
        if child is None:
            return tokens, path
        row = child + 1
        path.append(row)


def accept_step(inputs: StepInputs, tree: DraftTree, logits: torch.Tensor,
                params: SamplingParams, generator: torch.Generator | None
                ) -> tuple[list[int], list[int]]:
    """One step's acceptance: the tree an engine kept on the device walks there (one
    transfer); otherwise the host walk on a CPU and the device walk elsewhere (the same
    greedy answer; seeded sampling draws differ). Reading the result waits for the
    forward: the step's host sync."""
    if inputs.tree is not None:
        return inputs.tree.accept(logits, params, generator)
    walk = host_walk if logits.device.type == "cpu" else device_walk
    return walk(tree, logits, params, generator)
