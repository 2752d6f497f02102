"""Loading by hub id, through Transformers' own resolution, offline from a laid-out cache;
and nothing in the library changes the process's hub settings."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hub_cache import HUB_ID, lay_out

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.loading import ModelNotFoundError, load_model

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "The capital of France is"


def test_a_hub_id_loads_that_model_and_answers_as_the_same_weights(offline_hub,
                                                                    generator) -> None:
    by_id = SpeculativeGenerator.from_pretrained(HUB_ID, dtype="float32")
    assert by_id.model_name == HUB_ID and by_id.model is not generator.model
    assert by_id.model.config._name_or_path == HUB_ID  # Transformers resolved the id
    assert generator.model.config._name_or_path != HUB_ID
    ids = by_id.generate(QUESTION, [QUESTION], max_new_tokens=8).token_ids
    assert ids == generator.generate(QUESTION, [QUESTION], max_new_tokens=8).token_ids


def test_ask_by_hub_id_loads_that_model_and_answers(offline_hub, tmp_path, capsys) -> None:
    import json

    from ngram_trie_rag.commands.cli import main

    sample = ROOT / "examples" / "sample_docs"
    code = main(["ask", str(sample), "What does error code E2 mean on the Aurora K3?",
                 "--model", HUB_ID, "--json", "--rerank", "none", "--max-new-tokens", "16",
                 "--cache-dir", str(tmp_path)])
    assert code == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["model"] == HUB_ID and out["answer"] and out["tokens"] > 0


def test_without_the_packaged_wheel_the_default_comes_from_the_hub(offline_hub,
                                                                   monkeypatch) -> None:
    import huggingface_hub.constants as constants

    from ngram_trie_rag import loading

    lay_out(Path(constants.HF_HUB_CACHE).parent, loading.DEFAULT_HUB_ID)
    real = loading.importlib.util.find_spec
    monkeypatch.setattr(loading.importlib.util, "find_spec",
                        lambda name, *a: None if name == loading.DEFAULT_MODEL_PACKAGE
                        else real(name, *a))
    assert loading.default_model_source() == loading.DEFAULT_HUB_ID
    model, _ = load_model()
    assert model.config._name_or_path == loading.DEFAULT_HUB_ID


def test_an_id_missing_from_the_offline_cache_names_the_id(offline_hub) -> None:
    with pytest.raises(ModelNotFoundError, match=r"'NoOrg/no-such-model' \(HF_HUB_OFFLINE"):
        load_model("NoOrg/no-such-model")


def test_a_path_that_does_not_exist_is_not_looked_up_on_the_hub(tmp_path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        load_model("./models/nope")


def test_loader_options_pass_through_and_contradictions_are_refused(offline_hub) -> None:
    gen = SpeculativeGenerator.from_pretrained(HUB_ID, dtype="auto", revision="main",
                                               attn_implementation="eager", n=9)
    assert gen.config.n == 9 and gen.model.config._attn_implementation == "eager"
    with pytest.raises(TypeError, match=r"'revison' \(did you mean 'revision'\?\)"):
        SpeculativeGenerator.from_pretrained(HUB_ID, revison="main")
    with pytest.raises(ValueError, match="both place the model"):
        load_model(HUB_ID, device="cpu", model_kwargs={"device_map": "cpu"})
    with pytest.raises(ValueError, match="dtype is given twice"):
        load_model(HUB_ID, dtype="float32", model_kwargs={"dtype": "bfloat16"})


def test_attention_that_cannot_take_a_tree_mask_is_refused_by_name(generator) -> None:
    from ngram_trie_rag.engine.models.support import check_supported

    config = generator.model.config
    before = config._attn_implementation
    try:
        config._attn_implementation = "flash_attention_2"
        with pytest.raises(ValueError, match="flash_attention_2.*attn_implementation='sdpa'"):
            check_supported(generator.model)
    finally:
        config._attn_implementation = before


def _python(code: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def test_an_unreachable_hub_fails_fast_naming_the_id() -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # the discard port: nothing listens
    start = time.monotonic()
    done = _python("from ngram_trie_rag.loading import load_model\n"
                   "load_model('NoOrg/unreachable-model')", env)
    assert done.returncode != 0
    assert "'NoOrg/unreachable-model'" in done.stderr.strip().splitlines()[-1]
    assert time.monotonic() - start < 40  # no download retries: one probe of the hub


def test_importing_every_public_module_leaves_the_environment_alone() -> None:
    code = ("import os, importlib, pkgutil\n"
            "before = dict(os.environ)\n"
            "import ngram_trie_rag\n"
            "for m in pkgutil.walk_packages(ngram_trie_rag.__path__, 'ngram_trie_rag.'):\n"
            "    if m.name.split('.')[1] in ('serving',) or m.name.endswith('__main__'):\n"
            "        continue\n"
            "    importlib.import_module(m.name)\n"
            "for name in ('langchain_ngram_trie', 'llama_index.llms.ngram_trie'):\n"
            "    importlib.import_module(name)\n"
            "changed = {k for k in set(before) | set(os.environ)\n"
            "           if before.get(k) != os.environ.get(k)}\n"
            "assert not changed, sorted(changed)\n"
            "print('unchanged')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    done = _python(code, env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("unchanged")
