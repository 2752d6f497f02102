"""One vLLM run over HAGRID RAG prompts, all submitted at once; writes JSON (vLLM logs
to standard output, so the result goes to a file).

    python run_vllm.py MODEL_DIR {plain|trie} N_PROMPTS OUT.json

Run as its own process per configuration: vLLM starts engine processes of its own, and
one configuration per process keeps their lifetimes simple.
"""

from __future__ import annotations

import json
import sys
from itertools import islice

from vllm import LLM, SamplingParams

from ngram_trie_rag.reference import shared_data_dir
from ngram_trie_rag.retrieval.jsonl import read_jsonl
from ngram_trie_rag.serving.vllm_proposer import DOCUMENTS

PROPOSER = "ngram_trie_rag.serving.vllm_proposer.TrieProposer"


def main() -> None:
    model, method, count, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    options = {"model": model, "dtype": "float32", "max_model_len": 4096,
               "enforce_eager": True, "kv_cache_memory_bytes": 1 << 30, "seed": 0,
               "disable_log_stats": False}
    if method == "trie":
        options["speculative_config"] = {"model": PROPOSER, "num_speculative_tokens": 8}
    llm = LLM(**options)
    tokenizer = llm.get_tokenizer()
    hagrid = read_jsonl(shared_data_dir() / "hagrid" / "hagrid.jsonl")
    prompts, params = [], []
    for _, row in islice(hagrid, count):  # (line number, row)
        docs = [p for p in row["context"].split("\n\n") if p.strip()]
        messages = [{"role": "user", "content": row["turns"][0]}]
        prompts.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                     tokenize=False))
        params.append(SamplingParams(max_tokens=64, temperature=0, extra_args={DOCUMENTS: docs}))
    batched = llm.generate(prompts, params, use_tqdm=False)
    alone = llm.generate(prompts[:1], params[:1], use_tqdm=False)
    metrics = {m.name: m.value for m in llm.get_metrics()
               if m.name in ("vllm:spec_decode_num_drafts",
                             "vllm:spec_decode_num_accepted_tokens")}
    with open(out, "w") as f:
        json.dump({"batched": [list(o.outputs[0].token_ids) for o in batched],
                   "alone": list(alone[0].outputs[0].token_ids), "metrics": metrics}, f)


if __name__ == "__main__":
    main()
