"""One engine seam: every engine a name selects implements the protocol, says what it is,
and nothing outside ``ngram_trie_rag/engine`` reaches past the protocol into its parts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import transformers as tf
from model_families import SIZE, build, random_prompt, word_tokenizer

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.engine import EagerEngine, Engine, EngineInfo
from ngram_trie_rag.engine.choice import make_engine
from ngram_trie_rag.engine.engine_names import ENGINES
from ngram_trie_rag.engine.static_engine import StaticEngine

PACKAGE = Path(__file__).resolve().parents[1] / "ngram_trie_rag"
# an engine's parts or its kind, read from outside the engine package
REACHING_IN = re.compile(r"getattr\(.*engine, *\"compiled\"|engine\.(prefixes|last_threads|step|"
                         r"_\w+|compiled|capacity_for|reserve|compile_for)\b|"
                         r"isinstance\([^)]*(Eager|Static)Engine")


@pytest.fixture(scope="module")
def model():
    return build(tf.LlamaConfig(**SIZE), tf.LlamaForCausalLM)


@pytest.mark.parametrize("name", ENGINES)
def test_every_named_engine_implements_the_protocol_and_names_itself(model, name: str) -> None:
    engine = make_engine(model, name)
    assert isinstance(engine, Engine)
    info = engine.describe()
    assert info.name == name
    assert info.compiled == name.endswith("compiled")  # auto: not before its compile
    assert info.forward in ("llama-step", "modules")
    assert name in info.label()
    chosen = engine.choose(12, 8)  # what a request runs on: itself, or auto's choice
    assert chosen is engine or (name == "auto" and chosen is make_engine(model, "eager"))


def test_auto_chooses_the_eager_engine_before_any_answer(model) -> None:
    assert make_engine(model, "auto").choose(12, 8) is make_engine(model, "eager")


def test_engines_with_nothing_to_compile_warm_up_in_no_time(model) -> None:
    for engine in (EagerEngine(model), StaticEngine(model)):
        assert engine.warm_up([12, 40], new_tokens=8) == 0.0


def test_the_eager_engine_describes_the_variants_its_curve_chose(model) -> None:
    from ngram_trie_rag.engine import LatencyCurve

    curve = LatencyCurve({1: 0.01, 9: 0.02, 33: 0.05}, {9: "transposed"})
    info = EagerEngine(model, curve=curve).describe()
    assert info == EngineInfo("eager", False, info.forward, {9: "transposed"})
    assert "transposed at 9" in info.label()


def test_no_caller_outside_the_engine_reaches_into_one() -> None:
    offending = []
    for path in PACKAGE.rglob("*.py"):
        if path.is_relative_to(PACKAGE / "engine"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if REACHING_IN.search(line):
                offending.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert not offending, "\n".join(offending)


@pytest.mark.parametrize("name", ["eager", "static"])
def test_every_answer_names_the_engine_that_ran_it(model, name: str) -> None:
    gen = SpeculativeGenerator(model, word_tokenizer(), engine=make_engine(model, name))
    result = gen.generate(random_prompt(24), max_new_tokens=4)
    assert result.stats.engine == name == result.stats.to_dict()["engine"]
