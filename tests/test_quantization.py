"""int8 / int4 weights (and int8 activations, w8a8): every greedy path gives the
quantized model's own ``generate``.

The packaged model quantized both ways answers real Spec-Bench RAG prompts with the
trie and the chain on the eager and static engines, token-identical to that quantized
model's ``generate(do_sample=False)``; the architecture matrix does the same at toy
size. The kernels' row and column independence, which that rests on, is checked
bitwise; memory, the settings' spelling and every refusal are checked too.
"""

from __future__ import annotations

import pytest
import torch
from data_files import read_jsonl
from model_families import (
    FAMILIES,
    accepted,
    build,
    drafting_documents,
    pinned_generator,
    random_prompt,
    word_tokenizer,
)
from torch import nn

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.engine import static_engine
from ngram_trie_rag.engine.cpu import llama_step
from ngram_trie_rag.engine.quant import (
    SCHEMES,
    check_scheme,
    fused_layer,
    model_bytes,
    quantization_of,
    quantize_model,
)
from ngram_trie_rag.engine.quant.apply import SUMMARY, check_loader_quantization
from ngram_trie_rag.engine.quant.linear import Int4Linear, Int8DynamicLinear, Int8Linear, fuse
from ngram_trie_rag.engine.static_engine import StaticEngine
from ngram_trie_rag.loading import load_model
from ngram_trie_rag.reference import greedy_reference

MAX_NEW = 48
FAMILY_NEW = 32
LAYERS = {"int8": Int8Linear, "int4": Int4Linear, "w8a8": Int8DynamicLinear}


# ---- the layers ---------------------------------------------------------------------------

def _dequantized(layer: nn.Module, linear: nn.Linear) -> torch.Tensor:
    """The weight a quantized layer multiplies by, rebuilt from its integers (N, K)."""
    if isinstance(layer, Int8Linear):
        return layer.qweight.float() * layer.scale.float()[:, None]
    w = linear.weight.detach().float()
    n, k = w.shape
    pairs = layer.scales_and_zeros.float()[:, :n]  # (K / group, N, 2)
    scale = pairs[..., 0].t().repeat_interleave(layer.group, dim=1)  # (N, K)
    zero = pairs[..., 1].t().repeat_interleave(layer.group, dim=1)
    low = zero - 8 * scale
    q = ((w - low) / scale).round().clamp(0, 15)
    return (q - 8) * scale + zero


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_layer_multiplies_by_its_quantized_weight(scheme: str) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(576, 200, bias=True)  # 200 rows: int4 pads them to 208
    layer = LAYERS[scheme].quantize(linear)
    x = torch.randn(5, 576)
    if scheme == "w8a8":  # each row rounded to 127 steps of its absmax, fp32 out
        step = x.abs().amax(dim=1, keepdim=True) / 127
        expected = (x / step).round() * step @ _dequantized(layer, linear).t() + linear.bias
        tolerance = 1e-4
    else:  # bf16 activations in, the product back in bf16: a relative error of its rounding
        expected = x.bfloat16().float() @ _dequantized(layer, linear).t() + linear.bias
        tolerance = 2e-2
    out = layer(x)
    assert out.dtype == torch.float32 and out.shape == (5, 200)
    assert torch.allclose(out, expected, rtol=tolerance, atol=tolerance)
    # and the quantization error itself is what the scheme allows
    error = (_dequantized(layer, linear) - linear.weight).abs().max()
    assert error < (0.05 if scheme == "int4" else 0.01)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_rows_and_stacked_columns_are_bitwise_independent(scheme: str) -> None:
    """What exactness rests on: a row's product is the same whatever rows share the call,
    and q/k/v stacked into one product give the separate layers' bits."""
    torch.manual_seed(1)
    parts = [LAYERS[scheme].quantize(nn.Linear(576, n, bias=False)) for n in (576, 192, 192)]
    x = torch.randn(40, 576)
    alone = torch.cat([parts[0](x[i:i + 1]) for i in range(40)])
    assert torch.equal(parts[0](x), alone)
    separate = torch.cat([p(x) for p in parts], dim=-1)
    fused = fuse(parts)
    assert torch.equal(fused(x), separate)
    assert torch.equal(torch.cat([p(x) for p in parts], dim=-1), separate)  # views, same bits


# ---- the packaged model -------------------------------------------------------------------

@pytest.fixture(scope="module", params=SCHEMES)
def quantized(request) -> SpeculativeGenerator:
    return SpeculativeGenerator.from_pretrained(dtype="float32", engine="eager",
                                                quantization=request.param)


def _rag_ids(gen: SpeculativeGenerator, count: int) -> list[list[int]]:
    return [gen.encode_prompt([{"role": "user", "content": row["turns"][0]}])
            for row in read_jsonl("spec_bench/rag.jsonl", count)]


_REFERENCE: dict[tuple, list[int]] = {}


def _reference(gen: SpeculativeGenerator, ids: list[int]) -> list[int]:
    key = (id(gen.model), tuple(ids))
    if key not in _REFERENCE:
        _REFERENCE[key] = greedy_reference(gen.model, ids, MAX_NEW)
    return _REFERENCE[key]


@pytest.mark.slow
def test_packaged_model_greedy_equals_its_own_generate(quantized) -> None:
    """Trie on two prompts and chain on the first, drafting from the prompt, on the direct
    Llama step."""
    assert quantized.engine.step is not None  # the quantized layers run in the step
    drafted = 0
    for k, ids in enumerate(_rag_ids(quantized, 2)):
        expected = _reference(quantized, ids)
        for method in ("trie", "chain") if k == 0 else ("trie",):
            result = quantized.generate(ids, max_new_tokens=MAX_NEW, method=method)
            assert result.token_ids == expected, method
            drafted += accepted(result)
    assert drafted > 0


@pytest.mark.slow
def test_static_engine_equals_its_own_generate(quantized) -> None:
    engine = StaticEngine(quantized.model, compiled=False, curve=quantized.engine.curve)
    static = SpeculativeGenerator(quantized.model, quantized.tokenizer, engine=engine)
    for ids in _rag_ids(quantized, 1):
        result = static.generate(ids, max_new_tokens=MAX_NEW, method="trie")
        assert result.token_ids == _reference(quantized, ids)
        assert result.stats.engine == "static"


def test_memory_and_what_the_model_says_it_is(quantized) -> None:
    fp32, _ = load_model(dtype="float32")
    scheme = quantization_of(quantized.model)
    ratio = model_bytes(quantized.model) / model_bytes(fp32)
    assert ratio < {"int8": 0.35, "int4": 0.25, "w8a8": 0.35}[scheme]
    summary = getattr(quantized.model, SUMMARY)
    assert summary["parameters"] == sum(p.numel() for p in fp32.parameters())
    assert summary["layers"][scheme] == 211 and summary["fused"] == 60  # 30 layers x 2
    # int8 / int4 of an fp32 model on an AVX-512 CPU: every decoder layer in two C++ calls
    fused = scheme != "w8a8" and summary["activations"] == "torch.float32" \
        and fused_layer.kernel() is not None
    assert summary["fused_layers"] == (30 if fused else 0)
    assert quantization_of(fp32) is None
    # nothing float is left of the matrices: lm_head and the embedding are separate tables
    assert not any(type(m) is nn.Linear for m in quantized.model.modules())
    assert quantized.logits_width == quantized.vocab_size == 49152
    with pytest.raises(ValueError, match="already quantized"):
        quantize_model(quantized.model, scheme)


# ---- the architecture matrix, toy size ----------------------------------------------------

@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_family_quantized_equals_its_own_generate(name: str, scheme: str) -> None:
    model = quantize_model(build(FAMILIES[name]), scheme)
    ids = random_prompt(200, seed=3)
    expected = greedy_reference(model, ids, FAMILY_NEW)
    gen = pinned_generator(model)
    docs = drafting_documents(expected)
    for method in ("trie", "chain"):
        result = gen.generate(ids, documents=docs, max_new_tokens=FAMILY_NEW, method=method,
                              num_draft=8)
        assert result.token_ids == expected, method
        assert accepted(result) > 0, method


def test_a_llama_family_runs_the_direct_step_quantized() -> None:
    model = quantize_model(build(FAMILIES["llama-rope-llama3"]), "int4")
    assert llama_step.applies(model)
    assert pinned_generator(model).engine.step is not None


# ---- settings and refusals ----------------------------------------------------------------

def test_names_are_checked_with_the_nearest_one() -> None:
    assert check_scheme(None) is None and check_scheme("int4", "cpu") == "int4"
    with pytest.raises(ValueError, match="did you mean 'int8'"):
        check_scheme("int3")
    with pytest.raises(ValueError, match="CPU and CUDA only"):
        check_scheme("int8", "mps")
    with pytest.raises(ValueError, match="on a CUDA GPU use quantization='int8' or 'int4'"):
        check_scheme("w8a8", "cuda")


def test_a_second_quantization_or_bitsandbytes_on_a_cpu_is_refused_before_loading() -> None:
    bnb = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    with pytest.raises(ValueError, match="both quantize"):
        load_model(quantization="int8", model_kwargs={"quantization_config": bnb})
    with pytest.raises(ValueError, match="bitsandbytes quantization runs on CUDA"):
        load_model(device="cpu", model_kwargs={"quantization_config": bnb})
    with pytest.raises(ValueError, match="bitsandbytes"):
        check_loader_quantization(None, {"load_in_8bit": True}, torch.device("cpu"))
    with pytest.raises(ValueError, match="did you mean"):
        SpeculativeGenerator.from_pretrained(quantization="int-4")


def test_a_loaded_model_is_quantized_by_the_caller() -> None:
    model = build(FAMILIES["qwen2"])
    with pytest.raises(ValueError, match="quantize_model"):
        load_model(model, tokenizer=object(), quantization="int8")


def test_wrappers_take_the_setting_and_refuse_it_where_it_cannot_apply() -> None:
    from langchain_ngram_trie import ChatNGramTrie

    assert ChatNGramTrie(quantization="int4").quantization == "int4"
    with pytest.raises(ValueError, match="did you mean 'int4'"):
        ChatNGramTrie(quantization="in4")
    with pytest.raises(ValueError, match="quantization"):
        ChatNGramTrie(quantization="int8", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="quantization"):
        ChatNGramTrie(model=build(FAMILIES["qwen2"]), tokenizer=object(), quantization="int8")


@pytest.mark.slow
def test_batched_rows_equal_its_own_generate(quantized) -> None:
    """The local server's engine: rows joining and leaving, each its own greedy tokens."""
    from test_batched_engine import _run_batched, cases

    from ngram_trie_rag.engine.batched import BatchedEngine

    engine = BatchedEngine(quantized.model, max_batch=3, capacity=1024, base=quantized.engine)
    requests = cases(3)
    starts = [quantized._start(m, d, None, {"max_new_tokens": n}, engine=engine)
              for m, d, n in requests]
    got = _run_batched(quantized, engine, starts)
    for (_, _, n), start, tokens in zip(requests, starts, got, strict=True):
        assert tokens == greedy_reference(quantized.model, start.ids, n)
    assert sum(accepted(s.request) for s in starts) > 0


def test_the_full_measurement_times_the_stock_layout_only(monkeypatch, tmp_path) -> None:
    """``calibrate`` (and bench's measurement up front) on quantized weights: the linear
    layouts pack float weights, so they are not tried; the step is timed as it runs."""
    from ngram_trie_rag.engine import EagerEngine
    from ngram_trie_rag.engine.cpu import linear_layout

    monkeypatch.setenv("NGRAM_TRIE_RAG_CACHE", str(tmp_path))
    model = quantize_model(build(FAMILIES["llama-rope-llama3"]), "int4")
    assert not linear_layout.applies(model) and not linear_layout.prepack_applies(model)
    engine = EagerEngine(model)
    assert engine.calibrate() is not None
    assert engine.curve.layouts == {} and engine.curve.source == "measured"


def test_the_compiled_engines_refuse_quantized_weights_in_fp32() -> None:
    """Compiled, the quantized fp32 default model left its own ``generate`` on 3 of 8
    Spec-Bench RAG answers: refused by name rather than answered wrong."""
    model = quantize_model(build(FAMILIES["llama-rope-llama3"]), "int4")
    with pytest.raises(ValueError, match=r"compiled steps do not run quantized weights "
                                         r"\(int4\) in an fp32 model"):
        StaticEngine(model, compiled=True, buckets=(4,))
    assert StaticEngine(model, compiled=False, buckets=(4,)).compiled is False


@pytest.mark.skipif(static_engine.cpp_compiler() is None,
                    reason="torch.compile on a CPU needs a C++ compiler")
def test_a_bf16_quantized_model_runs_compiled() -> None:
    """In bf16, where no engine promises ``generate``'s tokens, quantized weights compile
    (the GPU's int4 step against bf16 is measured this way): every step of two answers
    runs the one compiled shape, with no recompile, and the answers have their length."""
    model = quantize_model(build(FAMILIES["llama-rope-llama3"]).to(torch.bfloat16), "int8")
    engine = StaticEngine(model, compiled=True, uniform=4, background=False)
    gen = SpeculativeGenerator(model, word_tokenizer(), engine=engine)
    calls = []
    step = engine._compiled_fn
    engine._compiled_fn = lambda *args: calls.append(1) or step(*args)
    prompt = random_prompt(24, seed=3)
    first = gen.generate(prompt, max_new_tokens=12, method="trie", num_draft=4,
                         documents=[prompt * 2])
    with torch.compiler.set_stance("fail_on_recompile"):
        second = gen.generate(prompt, max_new_tokens=12, method="none")
    assert len(first.token_ids) == len(second.token_ids) == 12
    steps = len(first.stats.accept_lengths) + len(second.stats.accept_lengths)
    assert len(calls) == steps and first.stats.engine == "uniform-compiled"


def test_auto_keeps_a_quantized_model_eager_where_it_would_compile(monkeypatch) -> None:
    from ngram_trie_rag.engine.auto import AUTO_ENV, AutoEngine

    monkeypatch.setenv(AUTO_ENV, "compiled")  # auto would compile here for a float model
    model = quantize_model(build(FAMILIES["llama-rope-llama3"]), "int8")
    engine = AutoEngine(model)
    assert engine.compiled is None and "quantized weights" in engine.why_eager
