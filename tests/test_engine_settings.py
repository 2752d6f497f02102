"""``engine=`` and ``capacity=`` by the same names everywhere: ``from_pretrained``,
``shared_generator``, the LangChain and LlamaIndex wrappers, and the command line. Each
is checked before anything loads, refused where it cannot apply (vLLM, a built
generator), and each answer names the engine that ran it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.commands import ask, calibrate, resident
from ngram_trie_rag.commands.cli import main
from ngram_trie_rag.wrappers.shared import shared_generator

lc = pytest.importorskip("langchain_ngram_trie")
li = pytest.importorskip("llama_index.llms.ngram_trie")

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sample_docs"
QUESTION = "What does error code E2 mean on the Aurora K3?"
FACT = "Error code E2 on the Aurora K3 means the water tank is empty: refill it."
URL = "http://127.0.0.1:9/v1"  # recorded at construction, never contacted
WRAPPERS = [lc.ChatNGramTrie, lc.NGramTrieLLM, li.NGramTrieLLM]
NEW_TOKENS = 4


# ---- from_pretrained and shared_generator -------------------------------------------------
@pytest.mark.parametrize(("settings", "message"), [
    ({"engine": "fast"}, "did you mean 'auto'"),
    ({"engine": "eager", "capacity": 128}, "does not have"),
    ({"capacity": 10}, "too small"),
])
def test_from_pretrained_checks_before_it_loads(settings, message, monkeypatch) -> None:
    from ngram_trie_rag import loading

    def refuse(*args, **kwargs) -> None:
        raise AssertionError("a bad engine setting must fail before the load")

    monkeypatch.setattr(loading, "load_model", refuse)
    with pytest.raises(ValueError, match=message):
        SpeculativeGenerator.from_pretrained(**settings)
    with pytest.raises(ValueError, match=message):
        shared_generator(**settings)


def test_from_pretrained_lists_every_engine() -> None:
    from ngram_trie_rag.engine.engine_names import ENGINES

    doc = SpeculativeGenerator.from_pretrained.__doc__ or ""
    assert all(f'``"{name}"``' in doc for name in ENGINES)


def test_shared_generator_loads_the_weights_once_for_two_engines() -> None:
    eager = shared_generator(engine="eager")
    static = shared_generator(engine="static")
    assert static.model is eager.model and static.tokenizer is eager.tokenizer
    assert (eager.engine.describe().name, static.engine.describe().name) == ("eager", "static")
    assert shared_generator(engine="static") is static  # cached under its engine
    shaped = shared_generator(engine="static", n=9)  # another trie shape, the same engine
    assert shaped.engine is static.engine and shaped.config.n == 9


# ---- the wrappers -------------------------------------------------------------------------
def _speculative(llm) -> dict:
    """The speculative stats of one short real call, where each wrapper reports them."""
    if isinstance(llm, lc.ChatNGramTrie):
        return llm.invoke(QUESTION, documents=[FACT]).response_metadata["speculative"]
    if isinstance(llm, lc.NGramTrieLLM):
        result = llm.generate([QUESTION], documents=[FACT])
        return result.generations[0][0].generation_info["speculative"]
    return llm.complete(QUESTION, documents=[FACT]).additional_kwargs["speculative"]


def _budget(cls: type) -> dict:
    return {"max_new_tokens" if cls is li.NGramTrieLLM else "max_tokens": NEW_TOKENS}


@pytest.mark.parametrize("cls", WRAPPERS)
def test_each_wrapper_runs_the_engine_it_names(cls) -> None:
    llm = cls(engine="static", **_budget(cls))
    stats = _speculative(llm)
    assert stats["engine"] == "static" and stats["decode_s"] > 0
    assert llm.active_backend.generator.model is shared_generator().model  # no second load


@pytest.mark.parametrize("cls", WRAPPERS)
@pytest.mark.parametrize(("settings", "message"), [
    ({"engine": "fast"}, r"unknown engine 'fast' \(did you mean 'auto'\?\)"),
    ({"engine": "statc"}, r"did you mean 'static'\?"),
    ({"engine": "eager", "capacity": 128}, "capacity sizes a preallocated cache"),
    ({"capacity": 10}, "capacity 10 is too small"),
    ({"capacity": True}, "capacity must be"),
    ({"engine": "static", "base_url": URL},
     "engine cannot be used where calls run on 'vllm-server'"),
    ({"capacity": 256, "backend": "vllm"}, "capacity cannot be used where calls run on 'vllm'"),
])
def test_bad_engine_settings_fail_at_construction(cls, settings, message) -> None:
    with pytest.raises(ValueError, match=message):
        cls(**settings)


@pytest.mark.parametrize("cls", WRAPPERS)
def test_the_defaults_choose_nothing_so_nothing_refuses_them(cls, generator) -> None:
    assert cls(base_url=URL, engine="auto", capacity=None).runs_on == "vllm-server"
    assert cls(generator=generator, engine="auto").active_backend.generator is generator


@pytest.mark.parametrize("cls", WRAPPERS)
def test_a_built_generator_has_its_own_engine(cls, generator) -> None:
    with pytest.raises(ValueError, match="engine cannot be set with generator=: the "
                                         "generator has its own engine"):
        cls(generator=generator, engine="static")
    with pytest.raises(ValueError, match="capacity cannot be set with generator="):
        cls(generator=generator, capacity=256)


def test_a_loaded_model_runs_on_the_engine_named(generator) -> None:
    llm = lc.ChatNGramTrie(model=generator.model, tokenizer=generator.tokenizer,
                           engine="static", max_tokens=NEW_TOKENS)
    assert llm.active_backend.generator.engine.describe().name == "static"
    assert llm._identifying_params["engine"] == "static"


# ---- the command line -----------------------------------------------------------------------
def _ask(tmp_path: Path, *flags: str) -> list[str]:
    return ["ask", str(SAMPLE), QUESTION, "--json", "--rerank", "none", "--max-new-tokens",
            str(NEW_TOKENS), "--keep-alive", "0", "--cache-dir", str(tmp_path), *flags]


@pytest.mark.parametrize(("argv", "message"), [
    (["--engine", "fast"], "argument --engine: invalid choice: 'fast'"),
    (["--capacity", "10"], "argument --capacity: capacity 10 is too small"),
    (["--capacity", "many"], "argument --capacity: expected an integer"),
    (["--engine", "eager", "--capacity", "128"],
     "--capacity 128 with --engine eager: capacity sizes a preallocated cache"),
])
def test_bad_engine_flags_are_one_line_errors(argv, message, tmp_path: Path, capsys) -> None:
    for command in (_ask(tmp_path), ["chat", str(SAMPLE)], ["calibrate"]):
        assert main([*command, *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err


def test_ask_reports_the_engine_it_ran(tmp_path: Path, capsys) -> None:
    assert main(_ask(tmp_path, "--engine", "static")) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["engine"] == "static" and out["timings"]["decode"] > 0
    # A one-shot ask leaves auto to the eager engine: it would never collect a compile.
    assert main(_ask(tmp_path)) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["engine"] == "eager"


def test_only_a_one_shot_ask_turns_auto_to_eager(monkeypatch) -> None:
    assert ask.one_shot_engine("auto", 256) == ("eager", None)
    assert ask.one_shot_engine("static", 256) == ("static", 256)
    monkeypatch.setattr(resident, "_IN_WORKER", True)  # as worker.main marks its process
    assert ask.one_shot_engine("auto", 256) == ("auto", 256)


def test_a_worker_serves_one_engine_and_capacity() -> None:
    keys = {resident.worker_key(None, None, None),
            resident.worker_key(None, None, None, "static"),
            resident.worker_key(None, None, None, "static", 256),
            resident.worker_key(None, None, None, "compiled", 256)}
    assert len(keys) == 4
    assert resident.worker_key(None, None, None) == resident.worker_key(None, None, None,
                                                                        "auto", None)
    with pytest.raises(ValueError, match="does not have"):
        resident.worker_key(None, None, None, "eager", 256)


def test_serve_takes_only_auto(capsys) -> None:
    base = ["serve", "--model", "/models/m", "--print-command"]
    assert main([*base, "--engine", "auto"]) == 0
    capsys.readouterr()
    assert main([*base, "--engine", "compiled"]) == 2
    err = capsys.readouterr().err
    assert "serve runs vLLM, whose engine is vLLM's own" in err
    assert "--engine applies to the local engine" in err
    assert main([*base, "--capacity", "256"]) == 2
    assert "--capacity applies to the local engine" in capsys.readouterr().err


def test_bench_takes_a_capacity_that_fits_its_engine(tmp_path: Path, capsys) -> None:
    from ngram_trie_rag.bench.config import BenchConfig

    assert BenchConfig(data="rows.jsonl", engine="compiled", capacity=256).capacity == 256
    with pytest.raises(ValueError, match="does not have"):
        BenchConfig(data="rows.jsonl", engine="eager", capacity=256)
    out = str(tmp_path / "results.json")
    assert main(["bench", "--data", "rows.jsonl", "--out", out, "--capacity", "10"]) == 2
    assert "argument --capacity: capacity 10 is too small" in capsys.readouterr().err
    assert main(["bench", "--data", "rows.jsonl", "--out", out, "--engine", "eager",
                 "--capacity", "256"]) == 2
    assert "error: capacity sizes a preallocated cache" in capsys.readouterr().err


def test_calibrate_compiles_the_named_engines_step(monkeypatch) -> None:
    from ngram_trie_rag.engine import choice

    calls: list[tuple] = []

    seconds = {"compiled": 1.25, "auto": 0.0}  # auto where it stays eager: nothing to do

    def make_engine(model, name: str, capacity: int | None = None) -> SimpleNamespace:
        calls.append(("make_engine", model, name, capacity))

        def warm_up(prompt_lengths: list[int], new_tokens: int) -> float:
            calls.append(("warm_up", prompt_lengths, new_tokens))
            return seconds[name]

        return SimpleNamespace(warm_up=warm_up)

    monkeypatch.setattr(choice, "make_engine", make_engine)
    assert calibrate._compile_step("model", "compiled", 256) == {"engine": "compiled",
                                                                "seconds": 1.25}
    assert calls == [("make_engine", "model", "compiled", 256), ("warm_up", [1], 1)]
    assert calibrate._compile_step("model", "auto", None) is None
    calls.clear()
    assert calibrate._compile_step("model", "static", None) is None  # nothing to compile
    assert calls == []
