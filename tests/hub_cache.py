"""A Hugging Face hub cache laid out from a packaged model, for loading by hub id offline.

``hub/models--ORG--NAME/refs/main`` holds a commit id and ``snapshots/<commit>/`` the
model's files (links to the converted default model), which is what
``huggingface_hub`` reads when ``HF_HUB_OFFLINE=1``: Transformers' own resolution of
``ORG/NAME`` runs, nothing is mocked.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HUB_ID = "TestOrg/SmolLM2-hub"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def lay_out(home: Path, hub_id: str = HUB_ID, source: Path | None = None) -> Path:
    """Make ``home`` an ``HF_HOME`` whose hub cache holds the model folder ``source`` (the
    default model's when None) as ``hub_id``."""
    from ngram_trie_rag.loading import default_model_dir

    org, name = hub_id.split("/")
    repo = home / "hub" / f"models--{org}--{name}"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    for file in (source or default_model_dir()).iterdir():
        link = snapshot / file.name
        if not link.exists():
            link.symlink_to(file)
    return home


@pytest.fixture()
def offline_hub(tmp_path_factory, monkeypatch) -> str:
    """A laid-out ``HF_HOME`` with this process's hub settings pointed at it, offline (the
    library reads them at import, so the process's copies are set too); its hub id."""
    point_at(lay_out(tmp_path_factory.mktemp("hf_home")), monkeypatch)
    return HUB_ID


def point_at(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's hub settings pointed at ``home``, offline (the library reads them
    at import, so the process's copies are set too)."""
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def model_folder() -> str:
    """The packaged default model's folder."""
    from ngram_trie_rag.loading import default_model_dir

    return str(default_model_dir())


@pytest.fixture(scope="module")
def loaded_model():
    """The packaged default model as a caller loads it (fp32, CPU), with its tokenizer."""
    from ngram_trie_rag.loading import load_model

    return load_model()
