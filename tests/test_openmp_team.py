"""One OpenMP team in the process: threads whose forwards are done let theirs go.

The release itself runs against the real libgomp in a subprocess (the suite runs with
``OMP_NUM_THREADS=1``, where no team is ever started); where it is called from -- the end
of every answer, a generator's and a scheduler's building thread, an idle scheduler --
is checked by recording the calls on a tiny Llama.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import transformers as tf
from model_families import SIZE, build, random_prompt, word_tokenizer

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.serving.scheduler import BatchScheduler

RELEASE = """
import os, torch
from ngram_trie_rag.engine.cpu import openmp_team
torch.set_num_threads(2)
x = torch.arange(8_000_000, dtype=torch.float64)
def tasks():
    return len(os.listdir("/proc/self/task"))
openmp_team.release()  # whatever started one so far (the import, arange)
before = tasks()
total = (x * 2).sum().item()  # a parallel region: this thread's team starts
during = tasks()
released = openmp_team.release()
after = tasks()
again = (x * 2).sum().item()  # a new team
print(before, during, released, after, tasks(), total == again)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libgomp on Linux only")
def test_release_lets_the_calling_threads_team_go() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", RELEASE], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    before, during, released, after, again, same = out
    assert released == "True"
    assert int(during) == int(before) + 1  # two threads: the caller and one worker
    assert int(after) == int(before)  # the worker is gone
    assert int(again) == int(during)  # and comes back with the next parallel region
    assert same == "True"


def _generator() -> SpeculativeGenerator:
    return SpeculativeGenerator(build(tf.LlamaConfig(**SIZE), tf.LlamaForCausalLM),
                                word_tokenizer())


def _on_thread(name: str, work) -> None:
    thread = threading.Thread(target=work, name=name)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()


def test_every_answer_lets_its_threads_team_go(released) -> None:
    gen = _generator()
    assert released == ["MainThread"]  # built here; its forwards may run elsewhere
    prompt = random_prompt(12)
    _on_thread("answers", lambda: gen.generate(prompt, max_new_tokens=6))
    assert released == ["MainThread", "answers"]

    def closed_early() -> None:
        stream = gen.stream(prompt, max_new_tokens=50)
        next(stream)
        stream.close()

    _on_thread("closed early", closed_early)
    assert released[-1] == "closed early"


def test_the_scheduler_runs_the_only_team(released) -> None:
    gen = _generator()
    with BatchScheduler(gen, max_batch=2, prefill_chunk=None) as scheduler:
        assert "MainThread" in released[1:]  # the thread that started the scheduler
        released.clear()
        scheduler.generate(random_prompt(12, seed=1), max_new_tokens=6)
        for _ in range(200):  # the scheduler's thread lets its team go once idle
            if "ngram-trie-rag-batch" in released:
                break
            threading.Event().wait(0.05)
        assert "ngram-trie-rag-batch" in released
