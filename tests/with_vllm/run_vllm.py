"""One vLLM run over HAGRID RAG prompts; writes JSON (vLLM logs to standard output, so
the result goes to a file).

    python run_vllm.py MODEL_DIR {plain|trie} N_PROMPTS OUT.json

Both configurations answer every prompt batched (all submitted at once) and the first
``CONSTRAINED`` prompts again under a JSON-schema grammar (vLLM's structured outputs,
which verify the trie's drafts against the grammar); ``trie`` also answers every prompt
alone (its answers must not depend on the batch; ``plain``'s batched answers are the
reference for both).
With ``trie`` the engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so
the run can also look at the proposer itself: which documents each request's drafter
was built from, how much per-request state is left once requests finish, and what an
aborted request leaves behind. It observes the real proposer by wrapping one of its
methods; nothing is replaced.
"""

from __future__ import annotations

import json
import os
import sys
from itertools import islice
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: data_files

from data_files import SHARED_DATA  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.sampling_params import StructuredOutputsParams  # noqa: E402

from ngram_trie_rag.bench.grammars import CITED, PRESETS  # noqa: E402
from ngram_trie_rag.retrieval.jsonl import read_jsonl  # noqa: E402
from ngram_trie_rag.serving.server import speculative_config  # noqa: E402
from ngram_trie_rag.serving.vllm_proposer import DOCUMENTS  # noqa: E402

MAX_TOKENS = 48
CONSTRAINED = 8


def _proposer(llm: LLM) -> Any:
    core = llm.llm_engine.engine_core.engine_core  # in-process engine core
    return core.model_executor.driver_worker.worker.model_runner.drafter


def _record_documents(proposer: Any) -> dict[str, list[list[int]]]:
    """Worker request id -> the documents its drafter was built from."""
    seen: dict[str, list[list[int]]] = {}
    propose = proposer.drafters.propose_classed

    def recording(req_id: str, tokens: Any, num_prompt: int, documents: Any, k: int) -> Any:
        if documents is not None and req_id not in proposer.drafters:
            seen[req_id] = [list(d) for d in documents]
        return propose(req_id, tokens, num_prompt, documents, k)

    proposer.drafters.propose_classed = recording
    return seen


def _live_state(proposer: Any) -> dict[str, list[str]]:
    """Request ids that still hold per-request state in the proposer."""
    return {"drafters": sorted(proposer.drafters._entries),
            "rates": sorted(proposer.lengths.rates._by_request)}


def _abort_mid_answer(llm: LLM, prompts: list[str], params: list[SamplingParams],
                      proposer: Any) -> dict:
    """Run two requests, abort one once its drafter exists, keep stepping the other."""
    engine = llm.llm_engine
    engine.add_request("keep", prompts[0], params[0])
    engine.add_request("abort", prompts[1], params[1])
    drafted = False
    for _ in range(200):
        engine.step()
        if any(r.startswith("abort") for r in proposer.drafters._entries):
            drafted = True
            break
    engine.abort_request(["abort"])
    for _ in range(3):
        engine.step()
    live = sorted(proposer.drafters._entries)
    while engine.has_unfinished_requests():
        engine.step()
    return {"abort_was_drafting": drafted, "live_after_abort": live}


def _constrained(llm: LLM, tokenizer: Any, rows: list[dict]) -> list[list[int]]:
    """Answers as ``{"answer", "quote"}`` JSON objects under the schema's grammar, batched."""
    prompts, params = [], []
    for row in rows:
        docs = [p for p in row["context"].split("\n\n") if p.strip()]
        ask = row["turns"][0] + "\n\n" + PRESETS["cited-json"][1]
        prompts.append(tokenizer.apply_chat_template([{"role": "user", "content": ask}],
                                                     add_generation_prompt=True, tokenize=False))
        params.append(SamplingParams(max_tokens=MAX_TOKENS * 2, temperature=0,
                                     extra_args={DOCUMENTS: docs},
                                     structured_outputs=StructuredOutputsParams(json=CITED)))
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


def main() -> None:
    model, method, count, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    options: dict[str, Any] = {"model": model, "dtype": "float32", "max_model_len": 4096,
                               "enforce_eager": True, "kv_cache_memory_bytes": 1 << 30,
                               "seed": 0, "disable_log_stats": False}
    if method == "trie":
        options["speculative_config"] = speculative_config(8)
    llm = LLM(**options)
    tokenizer = llm.get_tokenizer()
    prompts, params, documents = [], [], []
    rows = [row for _, row in islice(read_jsonl(SHARED_DATA / "hagrid" / "hagrid.jsonl"),
                                     count)]
    for row in rows:
        docs = [p for p in row["context"].split("\n\n") if p.strip()]
        messages = [{"role": "user", "content": row["turns"][0]}]
        prompts.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                     tokenize=False))
        params.append(SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                                     extra_args={DOCUMENTS: docs}))
        documents.append([tokenizer.encode(d, add_special_tokens=False) for d in docs])
    result: dict[str, Any] = {"documents": documents}
    proposer = _proposer(llm) if method == "trie" else None
    seen = _record_documents(proposer) if proposer is not None else {}
    batched = llm.generate(prompts, params, use_tqdm=False)
    result["batched"] = [list(o.outputs[0].token_ids) for o in batched]
    result["batched_ids"] = [o.request_id for o in batched]
    if proposer is not None:
        result["seen"] = seen
        result["state_after_batch"] = _live_state(proposer)
    if proposer is not None:
        result["alone"] = [list(llm.generate([p], [s], use_tqdm=False)[0].outputs[0].token_ids)
                           for p, s in zip(prompts, params, strict=True)]
        result["state_after_alone"] = _live_state(proposer)
        result["abort"] = _abort_mid_answer(llm, prompts, params, proposer)
    result["constrained"] = _constrained(llm, tokenizer, rows[:CONSTRAINED])
    result["metrics"] = {m.name: m.value for m in llm.get_metrics()
                         if m.name in ("vllm:spec_decode_num_drafts",
                                       "vllm:spec_decode_num_accepted_tokens")}
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
