"""Generator API on the real packaged model: inputs, stops, streaming, bad input."""

from __future__ import annotations

import threading

import pytest
import torch
from tiny_model import tiny_llama

from ngram_trie_rag import DraftConfig, SpeculativeGenerator
from ngram_trie_rag.loading import ModelNotFoundError, load_model
from ngram_trie_rag.reference import greedy_reference

QUESTION = [{"role": "user", "content": "List the first five letters of the alphabet."}]
DOCS = ["The first five letters of the alphabet are A, B, C, D and E.",
        "The alphabet has twenty-six letters."]


def test_string_chat_and_token_prompts_agree(generator) -> None:
    ids = generator.encode_prompt(QUESTION)
    text = generator.tokenizer.decode(ids)
    a = generator.generate(QUESTION, DOCS, max_new_tokens=16)
    b = generator.generate(ids, DOCS, max_new_tokens=16)
    c = generator.generate(text, DOCS, max_new_tokens=16)
    assert a.token_ids == b.token_ids == c.token_ids
    assert a.prompt_tokens == len(ids)
    assert a.stats.draft_source == "documents" and a.stats.num_documents == 2


def test_finish_reasons(generator) -> None:
    short = generator.generate(QUESTION, max_new_tokens=3)
    assert short.finish_reason == "length" and len(short.token_ids) == 3
    full = generator.generate([{"role": "user", "content": "Say hi."}], max_new_tokens=64)
    assert full.finish_reason == "eos"
    assert full.token_ids[-1] in generator.eos_token_ids
    assert "<|im_end|>" not in full.text


def test_stop_string_is_not_emitted_even_across_tokens(generator) -> None:
    base = generator.generate(QUESTION, DOCS, max_new_tokens=40)
    assert len(base.text) > 12
    stop = base.text[6:10]  # a stop string that likely spans a token boundary
    res = generator.generate(QUESTION, DOCS, max_new_tokens=40, stop=[stop])
    assert res.finish_reason == "stop"
    assert res.text == base.text[: base.text.index(stop)]
    assert res.token_ids == base.token_ids[: len(res.token_ids)]


def test_stream_concatenates_to_text_and_holds_partial_stops(generator) -> None:
    full = generator.generate(QUESTION, DOCS, max_new_tokens=40)
    stream = generator.stream(QUESTION, DOCS, max_new_tokens=40)
    deltas = list(stream)
    assert "".join(deltas) == full.text == stream.result.text
    assert stream.result.token_ids == full.token_ids


def test_stream_never_splits_multibyte_characters(generator) -> None:
    prompt = [{"role": "user", "content": "Repeat exactly: 日本語のテキスト 🚀 émigré"}]
    deltas = list(generator.stream(prompt, max_new_tokens=40))
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == generator.generate(prompt, max_new_tokens=40).text


def test_closing_a_stream_releases_the_model(generator) -> None:
    stream = generator.stream(QUESTION, max_new_tokens=40)
    next(stream)
    stream.close()
    done = threading.Event()

    def other() -> None:
        generator.generate(QUESTION, max_new_tokens=2)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    t.join(timeout=60)
    assert done.is_set(), "the lock was not released by close()"


def test_concurrent_threads_get_their_own_outputs(generator) -> None:
    prompts = [[{"role": "user", "content": f"Count from {i} to {i + 5}."}] for i in range(4)]
    expected = [generator.generate(p, max_new_tokens=12).token_ids for p in prompts]
    results: dict[int, list[int]] = {}

    def run(i: int) -> None:
        results[i] = generator.generate(prompts[i], max_new_tokens=12).token_ids

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [results[i] for i in range(4)] == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt": ""}, "prompt is empty"),
        ({"prompt": "   "}, "prompt is empty"),
        ({"prompt": []}, "prompt is empty"),
        ({"prompt": [10**9]}, "out of range"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": -3}, "max_new_tokens"),
        ({"num_draft": 0}, "num_draft"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"method": "magic"}, "unknown draft method"),
        ({"prompt": [{"content": "no role"}]}, "role"),
    ],
)
def test_bad_input_raises_clear_value_error(generator, kwargs: dict, message: str) -> None:
    args = {"prompt": QUESTION, "max_new_tokens": 4} | kwargs
    prompt = args.pop("prompt")
    with pytest.raises(ValueError, match=message):
        generator.generate(prompt, **args)


def test_blank_documents_are_dropped_not_refused(generator) -> None:
    """An empty chunk from a retriever is ordinary: nothing to draft from, no error."""
    result = generator.generate(QUESTION, documents=["", "  \n"], max_new_tokens=2)
    assert result.stats.draft_source == "prompt" and result.stats.num_documents == 0
    kept = generator.generate(QUESTION, documents=["ok", "  \n"], max_new_tokens=2)
    assert kept.stats.num_documents == 1 and kept.token_ids == result.token_ids


def test_documents_must_be_a_list(generator) -> None:
    with pytest.raises(TypeError, match="not a string"):
        generator.generate(QUESTION, documents="a single string", max_new_tokens=2)


def test_prompt_beyond_context_window_is_rejected(generator) -> None:
    too_long = [5] * (generator.context_window + 1)
    with pytest.raises(ValueError, match="context window"):
        generator.generate(too_long, max_new_tokens=2)


def test_generation_stops_at_the_context_window() -> None:
    model, tokenizer = tiny_llama(seed=2)
    gen = SpeculativeGenerator(model, tokenizer, n=4, prefix_len=2)
    prompt = [3, 4, 5] * 160  # 480 of 512 positions
    res = gen.generate(prompt, max_new_tokens=100)
    assert res.finish_reason in ("length", "eos")
    assert len(prompt) + len(res.token_ids) <= 512
    assert res.token_ids == greedy_reference(model, prompt, 32)[: len(res.token_ids)]


def test_long_documents_are_accepted_and_bounded(generator) -> None:
    long_doc = " ".join(f"word{i}" for i in range(40_000))  # ~100k tokens, drafting only
    gen = SpeculativeGenerator(generator.model, generator.tokenizer,
                               DraftConfig(max_trie_tokens=50_000))
    res = gen.generate(QUESTION, [long_doc], max_new_tokens=4)
    assert res.stats.trie_tokens <= 50_000


@pytest.mark.parametrize(("kwargs", "message"),
                         [({"n": 3, "prefix_len": 3}, "n must be greater"),
                          ({"num_draft": 0}, "num_draft"), ({"method": "x"}, "unknown")])
def test_bad_config(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DraftConfig(**kwargs)


def test_missing_model_path_names_what_was_looked_for(tmp_path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(ModelNotFoundError, match="config.json"):
        load_model(tmp_path)


def test_default_model_loads_from_the_converted_cache() -> None:
    from ngram_trie_rag.loading import default_model_dir

    folder = default_model_dir()
    assert (folder / "config.json").is_file() and list(folder.glob("*.safetensors"))
    model, tokenizer = load_model()
    assert model.config.model_type == "llama" and tokenizer.chat_template
    assert model.dtype == torch.float32 and model.device.type in ("cpu", "cuda")
