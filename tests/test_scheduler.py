"""The batch scheduler: concurrent requests in one batch, each answered as if alone.

Short answers (16 new tokens) over short prompts keep it fast; every wait has a timeout
so that a bug fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import pytest
from test_batched_engine import QUESTIONS, passages

from ngram_trie_rag.serving.scheduler import BatchScheduler, QueueFull, SchedulerClosed

pytestmark = pytest.mark.usefixtures("one_thread")
NEW = 16
WAIT = 240.0  # seconds any thread may take before the test fails (a shared, slow host)


def _request(i: int, prompts: int = 64) -> tuple[list[dict], list[str]]:
    """Request ``i``: the prompt ``i % prompts`` (a passage and a question), and
    documents no other request has."""
    found = sorted(passages(40), key=len)[:16]  # the shortest: quick prefills
    k = i % prompts
    passage = found[k % len(found)]
    question = QUESTIONS[(k // len(found)) % len(QUESTIONS)]
    messages = [{"role": "user", "content": f"Passage:\n{passage}\n\n{question}"}]
    return messages, [f"{passage} (note {i}: kept for request {i} only)"]


def _in_threads(work, count: int) -> list:
    """``work(i)`` for i < count on as many threads; the results, or the test fails."""
    out: list = [None] * count
    errors: list = []

    def run(i: int) -> None:
        try:
            out[i] = work(i)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + WAIT
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a request did not finish in time"
    assert not errors, errors
    return out


def _wait_for(condition, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_32_concurrent_requests_answer_as_alone(generator) -> None:
    # 16 prompts, each sent twice with documents of its own: a greedy answer depends on
    # the prompt alone, so each pair must agree with the prompt's answer decoded alone
    count, prompts, new = 32, 16, 12
    alone = [generator.generate(*_request(i), max_new_tokens=new).token_ids
             for i in range(prompts)]
    with BatchScheduler(generator, max_batch=8, capacity=512) as scheduler:
        assert (scheduler.max_batch, scheduler.capacity) == (8, 512)
        results = _in_threads(lambda i: scheduler.generate(*_request(i, prompts),
                                                           max_new_tokens=new), count)
        # unpadded steps (fp32 on a CPU with the row-wise kernel) cut each row's tree by
        # the steps' fitted cost; padded ones take one cap for all
        learner = scheduler.shares.cost if scheduler.engine.unpadded else None
        assert learner is None or learner.samples > 0
    for i, result in enumerate(results):
        assert result.token_ids == alone[i % prompts], f"request {i}"
        assert result.stats.engine == "batched"
        # drafted from its own documents: its trie is the one they alone build
        messages, docs = _request(i, prompts)
        own = generator.drafter(generator.encode_prompt(messages),
                                generator.encode_documents(docs))
        assert result.stats.trie_tokens == own.trie.num_tokens, f"request {i}"
        assert result.stats.draft_source == "documents"
        assert result.text == generator.tokenizer.decode(result.token_ids,
                                                         skip_special_tokens=True)


def test_a_full_queue_refuses_at_once(generator) -> None:
    with BatchScheduler(generator, max_batch=1, max_queue=2, capacity=512,
                        buffer_steps=1) as scheduler:
        first = scheduler.stream(*_request(0), max_new_tokens=NEW)  # runs, then pauses
        _wait_for(lambda: scheduler.running == 1)
        queued = [scheduler.stream(*_request(i), max_new_tokens=NEW) for i in (1, 2)]
        start = time.monotonic()
        with pytest.raises(QueueFull, match=r"max_queue=2.*larger max_queue"):
            scheduler.stream(*_request(3), max_new_tokens=NEW)
        assert time.monotonic() - start < 5.0
        for stream in (first, *queued):
            stream.close()


def test_closing_a_stream_early_frees_its_row(generator) -> None:
    with BatchScheduler(generator, max_batch=1, capacity=512, buffer_steps=2) as scheduler:
        stream = scheduler.stream(*_request(0), max_new_tokens=200)
        next(stream)
        stream.close()
        dropped = scheduler.stream(*_request(1), max_new_tokens=200)
        next(dropped)
        del dropped  # a stream dropped unread is cancelled too
        gc.collect()
        scheduler.stream(*_request(3), max_new_tokens=200).close()  # closed before any read
        result = _in_threads(lambda i: scheduler.generate(*_request(2), max_new_tokens=NEW),
                             1)[0]
        assert result.token_ids == generator.generate(*_request(2),
                                                      max_new_tokens=NEW).token_ids
        _wait_for(lambda: scheduler.running == 0, 30.0)


def test_a_slow_reader_does_not_stall_the_others(generator) -> None:
    with BatchScheduler(generator, max_batch=4, capacity=512, buffer_steps=2) as scheduler:
        slow = scheduler.stream(*_request(0), max_new_tokens=NEW)  # not read for a while
        results = _in_threads(
            lambda i: scheduler.generate(*_request(i + 1), max_new_tokens=NEW), 3)
        assert all(r.finish_reason in ("length", "eos") for r in results)
        text = "".join(slow)  # read at last: it resumes and ends as it would have
        assert slow.result is not None
        assert text == slow.result.text
        assert slow.result.token_ids == generator.generate(*_request(0),
                                                           max_new_tokens=NEW).token_ids


def test_a_request_too_long_for_a_row_is_refused_with_the_numbers(generator) -> None:
    with BatchScheduler(generator, max_batch=1, capacity=256) as scheduler:
        with pytest.raises(ValueError, match=r"plus max_new_tokens=300 needs \d+ positions, "
                                             r"more than .* 256"):
            scheduler.stream(*_request(0), max_new_tokens=300)
        with pytest.raises(TypeError):  # the generator's own checks
            scheduler.stream("hi", no_such_option=1)


def test_close_ends_pending_requests_with_an_error(generator) -> None:
    scheduler = BatchScheduler(generator, max_batch=1, capacity=512, buffer_steps=1)
    running = scheduler.stream(*_request(0), max_new_tokens=NEW)  # pauses unread
    waiting = scheduler.stream(*_request(1), max_new_tokens=NEW)
    _wait_for(lambda: scheduler.running == 1)
    start = time.monotonic()
    scheduler.close()
    assert time.monotonic() - start < 30.0
    for stream in (running, waiting):
        with pytest.raises(SchedulerClosed):
            "".join(stream)
    with pytest.raises(SchedulerClosed):
        scheduler.stream("hi", max_new_tokens=4)


def test_async_generate_and_stream(generator) -> None:
    async def both(scheduler: BatchScheduler) -> tuple:
        result = await scheduler.agenerate(*_request(0), max_new_tokens=6)
        text = "".join([d async for d in scheduler.astream(*_request(0), max_new_tokens=6)])
        return result, text

    with BatchScheduler(generator, max_batch=2, capacity=512) as scheduler:
        result, text = asyncio.run(both(scheduler))
    assert text == result.text and len(result.token_ids) <= 6


def _long_request() -> tuple[list[dict], list[str]]:
    """A prompt of several passages (a few hundred tokens), with documents of its own."""
    text = "\n\n".join(sorted(passages(40), key=len)[-4:])
    return ([{"role": "user", "content": f"Passages:\n{text}\n\n{QUESTIONS[0]}"}],
            [f"{text} (kept for the long request only)"])


@pytest.mark.parametrize("chunk", [48, None])
def test_a_long_prompt_joins_a_chunk_at_a_time(generator, chunk) -> None:
    # one row decodes while a long prompt joins: with chunks, the row takes a step after
    # each chunk (the new prompt never holds it for its whole prefill); with None, the
    # prompt is cached in one forward. Both rows answer as alone either way.
    new = 64  # the decoding row drafts nothing: one token a step
    long_ids = generator.encode_prompt(_long_request()[0])
    alone = [generator.generate(*_request(4), max_new_tokens=new).token_ids,  # 60 tokens
             generator.generate(*_long_request(), max_new_tokens=NEW).token_ids]
    with BatchScheduler(generator, max_batch=2, capacity=1024, buffer_steps=new,
                        prefill_chunk=chunk) as scheduler:
        running = scheduler.stream(*_request(4), max_new_tokens=new,
                                   method="none")  # unread, and never paused
        next(running)
        _wait_for(lambda: scheduler.steps_run >= 1)
        before = scheduler.steps_run
        joining = scheduler.stream(*_long_request(), max_new_tokens=NEW)
        next(joining)  # its first token: the whole prompt is cached
        between = scheduler.steps_run - before
        results = [running.read_all(), joining.read_all()]
    chunks = -(-len(long_ids) // 48)
    assert 8 <= chunks < len(alone[0]) - 1 - before  # steps left to the decoding row
    if chunk is None:
        assert between <= 2  # the step that was running, at most one more
    else:  # each chunk but the last is followed by a step of the decoding row
        assert between >= chunks - 1, (between, chunks)
    assert [r.token_ids for r in results] == alone


@pytest.mark.parametrize(("setting", "value"), [("prefill_chunk", 0), ("max_batch", None),
                                                ("buffer_steps", 1.5)])
def test_bad_settings_are_refused_by_name(generator, setting, value) -> None:
    with pytest.raises(ValueError, match=f"{setting} must be an integer >= 1"):
        BatchScheduler(generator, **{setting: value})
