"""The transposed linear layout inside a traced step: what the mode computes, which
products it routes, and the measured choice of row counts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model_families import FAMILIES, build
from torch.utils._python_dispatch import TorchDispatchMode

from ngram_trie_rag.engine.cpu.transposed_rows import TransposedRows, faster_transposed


class _MatrixProducts(TorchDispatchMode):
    """Records the first operand's shape of every aten.mm."""

    def __init__(self) -> None:
        super().__init__()
        self.first: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mm.default:
            self.first.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_listed_rows_run_weight_first_and_compute_the_same(rows: int, bias: bool) -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 40, bias=bias)
    x = torch.randn(1, rows, 24)
    products = _MatrixProducts()
    with torch.inference_mode(), products, TransposedRows(frozenset({rows})):
        got = layer(x)
    assert products.first == [(40, 24)]  # W @ x^T: the weight is the first operand
    assert got.shape == (1, rows, 40) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias))


def test_keyword_arguments_are_read_too() -> None:
    torch.manual_seed(0)
    weight, bias, x = torch.randn(8, 4), torch.randn(8), torch.randn(1, 4)
    with torch.inference_mode(), TransposedRows(frozenset({1})):
        got = F.linear(x, weight=weight, bias=bias)
    torch.testing.assert_close(got, F.linear(x, weight, bias))


def test_unlisted_rows_and_other_calls_run_unchanged() -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 40)
    x = torch.randn(2, 24)
    products = _MatrixProducts()
    with torch.inference_mode(), products, TransposedRows(frozenset({1})):
        got = layer(x)
        total = torch.sum(x)
    assert products.first == []  # addmm, as nn.Linear runs it
    assert torch.equal(got, F.linear(x, layer.weight, layer.bias))
    assert torch.equal(total, x.sum())


def test_a_traced_step_bakes_the_layout_in() -> None:
    """Dynamo traces the mode (fullgraph): the compiled graph computes the listed rows
    transposed, and its results match the module's."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 32)

    def step(x: torch.Tensor) -> torch.Tensor:
        with TransposedRows(frozenset({1})):
            return layer(x)

    x = torch.randn(1, 16)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.inference_mode():
        got = torch.compile(step, fullgraph=True, dynamic=False, backend=backend)(x)
    torch.testing.assert_close(got, layer(x))
    targets = {node.target for node in graphs[0].graph.nodes}
    assert torch.mm in targets and F.linear not in targets


def test_the_choice_is_a_subset_of_the_asked_counts() -> None:
    model = build(FAMILIES["qwen2"])
    chosen = faster_transposed(model, [1, 5, 9], repeats=1)
    assert chosen <= {1, 5, 9}
