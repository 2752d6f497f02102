"""Grammar-constrained decoding: masks per draft-tree node, and speculative output
identical to constrained plain greedy decoding (one token a step, same masks) with the
real packaged model in fp32."""

from __future__ import annotations

import json
from itertools import islice

import numpy as np
import pytest
import torch

xgr = pytest.importorskip("xgrammar")

from data_files import SHARED_DATA  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from ngram_trie_rag import DraftTree, SpeculativeGenerator  # noqa: E402
from ngram_trie_rag.bench.data import load_items  # noqa: E402
from ngram_trie_rag.decoding.grammar import Grammar, _retrieve_arrays, compiler_for  # noqa: E402


class Cited(BaseModel):
    answer: str
    quote: str


@pytest.fixture(scope="module")
def gen() -> SpeculativeGenerator:
    return SpeculativeGenerator.from_pretrained(dtype="float32")


@pytest.fixture(scope="module")
def compiler(gen: SpeculativeGenerator):
    return compiler_for(gen.tokenizer, gen.logits_width)


def test_tree_layout_for_xgrammar() -> None:
    # committed -> a(1) -> b(2); committed -> c(3) -> d(4), e(5)
    tree = DraftTree(np.array([7, 8, 9, 10, 11]), np.array([-1, 0, -1, 2, 2]),
                     np.array([1, 2, 1, 2, 2]))
    first, sibling = _retrieve_arrays(tree)
    assert first.tolist() == [1, 2, -1, 4, -1, -1]
    assert sibling.tolist() == [-1, 3, -1, -1, 5, -1]


def test_grammar_specs() -> None:
    assert json.loads(Grammar.json_schema(Cited).source)["required"] == ["answer", "quote"]
    assert Grammar.json_schema({"type": "string"}).source == '{"type": "string"}'
    with pytest.raises(ValueError, match="unknown grammar kind"):
        Grammar("yaml")
    with pytest.raises(TypeError):
        Grammar.json_schema(42)


def test_a_schema_that_cannot_compile_is_a_clear_error(compiler) -> None:
    with pytest.raises(ValueError, match="cannot compile the json_schema grammar"):
        compiler.compile(Grammar.json_schema('{"type": "no-such-type"}'))
    with pytest.raises(ValueError, match="cannot compile the regex grammar"):
        compiler.compile(Grammar.regex("(unclosed"))


def test_every_node_gets_the_mask_of_its_own_path(gen, compiler) -> None:
    tok = gen.tokenizer
    grammar = Grammar.json_schema(Cited)
    constraint = compiler.constraint(grammar)
    start = tok.encode('{"answer": "', add_special_tokens=False)
    constraint.advance(start)
    a, b, c = (tok.encode(s, add_special_tokens=False)[0] for s in ("Paris", " is", "\n"))
    # Paris -> is ; a raw newline (invalid inside a JSON string)
    tree = DraftTree(np.array([a, b, c]), np.array([-1, 0, -1]), np.array([1, 2, 1]))
    masks = constraint.masks(start[-1], tree)
    for row, path in enumerate([[], [a], [a, b]]):
        ref = compiler.constraint(grammar)
        ref.advance(start + path)
        assert masks[row].equal(ref.masks(-1, DraftTree.empty())[0]), row
    assert not masks[3].any()  # the rejected node's row allows nothing
    assert not masks[0, 1]  # <|im_start|> is not allowed inside a JSON string


def test_greedy_masks_only_rows_whose_argmax_the_grammar_forbids(gen, compiler) -> None:
    """Greedy choices under the cheap mask equal those under the full mask, on rows whose
    argmax is allowed (left as they are) and rows where it is not (masked)."""
    tok = gen.tokenizer
    constraint = compiler.constraint(Grammar.json_schema(Cited))
    start = tok.encode('{"answer": "', add_special_tokens=False)
    constraint.advance(start)
    a, b = (tok.encode(s, add_special_tokens=False)[0] for s in ("Paris", " is"))
    tree = DraftTree(np.array([a, b]), np.array([-1, 0]), np.array([1, 2]))
    bitmask = constraint.bitmasks(start[-1], tree)
    full = constraint.masks(start[-1], tree)
    gen_ = torch.Generator().manual_seed(0)
    logits = torch.randn(3, full.shape[1], generator=gen_)
    logits[0, 1] = 100.0  # <|im_start|>: banned inside the string
    logits[1, a] = 100.0  # allowed: row kept as it is
    cheap = constraint.apply(logits, bitmask, greedy=True)
    want = logits.masked_fill(~full, float("-inf"))
    assert cheap.argmax(-1).tolist() == want.argmax(-1).tolist()
    assert cheap[1].equal(logits[1]) and not cheap[0].equal(logits[0])
    assert constraint.apply(logits, bitmask, greedy=False).equal(want)


def test_the_committed_mask_is_filled_once_per_step(gen, compiler,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The forced-token walk and a plain step's mask share one fill of the committed
    matcher; emitting tokens moves it on."""
    tok = gen.tokenizer
    constraint = compiler.constraint(Grammar.json_schema(Cited))
    fills: list[object] = []
    real = type(constraint)._fill

    def counted(self, matcher):  # the real fill, counted
        fills.append(matcher)
        return real(self, matcher)

    monkeypatch.setattr(type(constraint), "_fill", counted)
    start = tok.encode('{"answer": "', add_special_tokens=False)
    constraint.advance(start)
    assert constraint.forced(4) == []  # free text inside the string: nothing forced
    plain = constraint.bitmasks(start[-1], DraftTree.empty())
    assert len(fills) == 1 and fills[0] is constraint.matcher
    fresh = real(constraint, constraint.matcher)
    assert plain.equal(fresh)
    word = tok.encode("Paris", add_special_tokens=False)
    constraint.advance(word + tok.encode('"', add_special_tokens=False))
    after = constraint.bitmasks(word[-1], DraftTree.empty())  # what follows the string
    assert len(fills) == 2
    assert after.equal(real(constraint, constraint.matcher)) and not after.equal(plain)


def _prompts(count: int) -> list:
    return list(islice(load_items(SHARED_DATA / "hagrid" / "hagrid.jsonl"), count))


_PLAIN: dict = {}  # (generator, prompt) -> its constrained plain greedy answer


@pytest.mark.slow
@pytest.mark.parametrize(("method", "prompts"), [("trie", 3), ("chain", 2)])
def test_constrained_speculation_equals_constrained_greedy(gen, method: str,
                                                           prompts: int) -> None:
    grammar = Grammar.json_schema(Cited)
    accepted = 0
    for item in _prompts(prompts):
        messages = [{"role": "user", "content": item.text + "\nAnswer as JSON with an "
                     "answer and a quote copied from the passages."}]
        key = (id(gen), item.text)
        if key not in _PLAIN:  # the same for both methods
            _PLAIN[key] = gen.generate(messages, item.documents, max_new_tokens=80,
                                       method="none", grammar=grammar)
        plain = _PLAIN[key]
        spec = gen.generate(messages, item.documents, max_new_tokens=80, method=method,
                            grammar=grammar)
        assert spec.token_ids == plain.token_ids
        accepted += sum(n - 1 for n in spec.stats.accept_lengths)
        if plain.finish_reason == "eos":
            Cited.model_validate_json(plain.text)
    assert accepted > 0  # drafts were accepted under the grammar


def test_json_mode_and_regex(gen) -> None:
    item = _prompts(1)[0]
    out = gen.generate(item.text + "\nAnswer in JSON.", item.documents, max_new_tokens=48,
                       grammar=Grammar.json())
    if out.finish_reason == "eos":
        json.loads(out.text)
    else:
        assert out.text.lstrip()[:1] in "{[\"-0123456789tfn"
    year = gen.generate("The year the Eiffel Tower opened:", max_new_tokens=8,
                        grammar=Grammar.regex(r" [0-9]{4}"))
    assert year.finish_reason == "eos"
    assert len(year.text.strip()) == 4 and year.text.strip().isdigit()


def test_sampling_under_a_grammar_stays_in_the_grammar(gen) -> None:
    item = _prompts(1)[0]
    out = gen.generate(item.text, item.documents, max_new_tokens=80, temperature=0.8,
                       seed=3, grammar=Grammar.json_schema(Cited))
    if out.finish_reason == "eos":
        Cited.model_validate_json(out.text)
    assert out.text.startswith('{"answer": "')
