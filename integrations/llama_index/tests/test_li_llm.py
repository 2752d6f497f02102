"""NGramTrieLLM on its own: the LlamaIndex LLM surface, stats, draft sources, async."""

from __future__ import annotations

import asyncio
import time

from llama_index.core.llms import ChatMessage
from llama_index.core.schema import NodeWithScore, TextNode

from llama_index.llms.ngram_trie import NGramTrieLLM

N = 16  # new tokens per call: enough to exercise drafting, cheap on a busy CPU
QUESTION = "Who wrote the play Hamlet, and when?"
USER = [{"role": "user", "content": QUESTION}]
DOC = (
    "Hamlet is a tragedy written by William Shakespeare sometime between 1599 and 1601. "
    "It is Shakespeare's longest play, with 29,551 words."
)
PASSAGE = (
    "The lighthouse keeper climbed the spiral stairs at dusk, lit the great lamp, and "
    "wrote the hour, the wind and the state of the sea into the logbook on the desk."
)


def test_metadata_describes_the_model_without_loading_twice(li_llm):
    meta = li_llm.metadata
    assert meta.context_window == li_llm.generator.context_window == 8192
    assert meta.num_output == li_llm.max_new_tokens
    assert meta.is_chat_model  # SmolLM2-Instruct has a chat template
    assert meta.model_name == "SmolLM2-135M-Instruct"
    other = NGramTrieLLM(max_new_tokens=8, temperature=0.5)
    assert other.generator is li_llm.generator  # same model: shared, not reloaded


def test_other_trie_shapes_share_the_loaded_model(li_llm):
    shaped = NGramTrieLLM(n=9, prefix_len=2, max_new_tokens=4)
    gen = shaped.generator
    assert gen is not li_llm.generator
    assert (gen.config.n, gen.config.prefix_len) == (9, 2)
    assert gen.model is li_llm.generator.model  # weights loaded once per model
    assert gen.tokenizer is li_llm.generator.tokenizer
    assert NGramTrieLLM(n=9, prefix_len=2).generator is gen
    assert shaped.complete(QUESTION, documents=[DOC]).text


def test_copying_a_passage_accepts_drafted_tokens(li_llm, li_plain_llm):
    prompt = f"Repeat this passage word for word.\n\n{PASSAGE}"
    response = li_llm.complete(prompt, documents=[PASSAGE], max_new_tokens=24)
    assert response.text == li_plain_llm.answer([{"role": "user", "content": prompt}], 24)
    stats = response.additional_kwargs["speculative"]
    assert stats["draft_source"] == "documents"
    assert sum(a - 1 for a in stats["accept_lengths"]) > 0  # some drafted tokens accepted
    assert stats["mean_accept_length"] > 1.5


def test_metadata_overrides_need_no_model():
    llm = NGramTrieLLM(context_window=2048, is_chat_model=False, model_name="m")
    assert llm.metadata.context_window == 2048
    assert not llm.active_backend.loaded  # nothing loaded yet


def test_complete_is_plain_greedy_and_reports_stats(li_llm, li_plain_llm):
    response = li_llm.complete(QUESTION, max_new_tokens=N)
    assert response.text == li_plain_llm.answer(USER, N)  # chat model: the user turn
    extra = response.additional_kwargs
    stats = extra["speculative"]
    assert extra["draft_origin"] == "prompt" and stats["draft_source"] == "prompt"
    assert stats["steps"] == len(stats["accept_lengths"]) >= 1
    assert extra["completion_tokens"] == len(response.raw["token_ids"])
    assert response.raw["usage"]["total_tokens"] == (
        extra["prompt_tokens"] + extra["completion_tokens"])
    assert extra["finish_reason"] in ("eos", "length")


def test_documents_argument_is_the_draft_source(li_llm, li_plain_llm):
    response = li_llm.complete(QUESTION, documents=[DOC, "  ", DOC], max_new_tokens=N)
    assert response.raw["draft_texts"] == [DOC, "  ", DOC]  # passed on as given
    assert response.additional_kwargs["draft_origin"] == "documents"
    # the core drops the blank text and the repeat: one document drafted from
    assert response.additional_kwargs["speculative"]["num_documents"] == 1
    assert response.text == li_plain_llm.answer(USER, N)


def test_formatted_prompt_goes_to_the_model_as_is(li_llm, li_plain_llm):
    prompt = f"Question: {QUESTION}\nAnswer:"
    response = li_llm.complete(prompt, formatted=True, max_new_tokens=N)
    assert response.text == li_plain_llm.answer(prompt, N)
    assert response.additional_kwargs["prompt_tokens"] == len(
        li_llm.generator.encode_prompt(prompt))


def test_blank_and_repeated_nodes_are_passed_on_and_dropped_by_the_core(li_llm):
    """An empty node (an image's, an empty page) is an ordinary retrieval result: the
    node goes on as retrieved, and the engine drafts from each distinct text once."""
    nodes = [TextNode(id_="a", text=DOC), TextNode(id_="b", text=QUESTION),
             TextNode(id_="c", text=DOC), TextNode(id_="empty", text=" ")]
    with li_llm.drafting_from(nodes) as source:
        inside = li_llm.complete(QUESTION, max_new_tokens=4)
    assert source.node_ids == ("a", "b", "c", "empty")
    assert source.texts == (DOC, QUESTION, DOC, " ")
    assert inside.raw["draft_node_ids"] == ["a", "b", "c", "empty"]
    stats = inside.raw["speculative"]
    assert stats["draft_source"] == "documents" and stats["num_documents"] == 2
    with li_llm.drafting_from([TextNode(id_="empty", text="")]):
        blank = li_llm.complete(QUESTION, max_new_tokens=4)
    assert blank.raw["draft_origin"] == "documents"  # given, but nothing to draft from
    assert blank.raw["speculative"]["draft_source"] == "prompt"
    assert blank.text == inside.text  # drafting changes speed, never the answer


def test_drafting_from_block_applies_inside_only(li_llm):
    node = NodeWithScore(node=TextNode(id_="hamlet", text=DOC), score=1.0)
    with li_llm.drafting_from([node]) as source:
        inside = li_llm.complete(QUESTION, max_new_tokens=8)
    assert source.node_ids == ("hamlet",)
    assert inside.raw["draft_node_ids"] == ["hamlet"] and inside.raw["draft_texts"] == [DOC]
    outside = li_llm.complete(QUESTION, max_new_tokens=8)
    assert outside.raw["draft_origin"] == "prompt"


def test_chat_uses_the_chat_template(li_llm, li_plain_llm):
    messages = [
        ChatMessage(role="system", content="Answer in one sentence."),
        ChatMessage(role="user", content=QUESTION),
    ]
    response = li_llm.chat(messages, documents=[DOC], max_new_tokens=N)
    expected = li_plain_llm.answer([{"role": m.role.value, "content": m.content}
                                    for m in messages], N)
    assert response.message.content == expected
    assert response.message.role == "assistant"
    assert response.additional_kwargs["speculative"]["draft_source"] == "documents"


def test_streams_join_to_the_full_answer_and_end_with_stats(li_llm, li_plain_llm):
    full = li_plain_llm.answer(USER, N)
    chunks = list(li_llm.stream_complete(QUESTION, documents=[DOC], max_new_tokens=N))
    assert "".join(c.delta for c in chunks) == full == chunks[-1].text
    assert chunks[-1].additional_kwargs["speculative"]["steps"] >= 1
    chat_chunks = list(li_llm.stream_chat([ChatMessage(role="user", content=QUESTION)],
                                          documents=[DOC], max_new_tokens=N))
    assert chat_chunks[-1].message.content == full
    assert "speculative" in chat_chunks[-1].raw


def test_closing_a_stream_early_frees_the_model(li_llm):
    stream = li_llm.stream_complete(QUESTION)
    next(stream)
    assert li_llm.generator.busy
    stream.close()
    assert not li_llm.generator.busy


async def test_async_variants_match_sync(li_llm, li_plain_llm):
    messages = [ChatMessage(role="user", content=QUESTION)]
    sync = li_plain_llm.answer(USER, N)
    kw = {"documents": [DOC], "max_new_tokens": N}
    assert (await li_llm.acomplete(QUESTION, **kw)).text == sync
    assert (await li_llm.achat(messages, **kw)).message.content == sync
    deltas = [c.delta async for c in await li_llm.astream_complete(QUESTION, **kw)]
    assert "".join(deltas) == sync
    chunks = [c async for c in await li_llm.astream_chat(messages, **kw)]
    last = chunks[-1]
    assert last.message.content == sync and "speculative" in last.additional_kwargs


async def test_async_generation_leaves_the_event_loop_free(li_llm):
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(ticker())
    start = time.perf_counter()
    await li_llm.acomplete(QUESTION, max_new_tokens=N)
    elapsed = time.perf_counter() - start
    done.set()
    await task
    assert ticks >= max(3, int(elapsed / 0.01 * 0.3))  # the loop kept running meanwhile


async def test_cancelled_call_frees_the_model(li_llm):
    task = asyncio.create_task(li_llm.acomplete(QUESTION, max_new_tokens=200))
    await asyncio.sleep(0.5)
    task.cancel()
    deadline = time.monotonic() + 10
    while li_llm.generator.busy and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not li_llm.generator.busy
    assert (await li_llm.acomplete(QUESTION, max_new_tokens=4)).text  # still usable


def test_bad_numbers_and_bytes_are_clear_errors(li_llm):
    """Refused by name before the model runs, never as an error from inside torch."""
    import pytest

    cases = [({"temperature": float("nan")}, ValueError, "temperature must be a finite"),
             ({"max_new_tokens": 3.7}, TypeError, "max_new_tokens must be an integer"),
             ({"top_k": False}, TypeError, "top_k must be an integer, got False"),
             ({"num_draft": 0}, ValueError, "num_draft must be >= 1"),
             ({"documents": [b"Error E2"]}, TypeError, "document 0 is bytes.*decode"),
             # a single item is one document, as a single string is
             ({"documents": b"Error E2"}, TypeError, "document 0 is bytes.*decode"),
             ({"documents": [{"text": DOC}]}, TypeError,
              "document 0 must be a string or a list of token ids, got dict")]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            li_llm.complete(QUESTION, **kwargs)
    with pytest.raises(ValueError, match="max_new_tokens must be a number, got True"):
        NGramTrieLLM(max_new_tokens=True)
