"""Publishing a converted model folder when several processes convert at once."""

from __future__ import annotations

from pathlib import Path

from ngram_trie_rag.loading import _publish


def _folder(path: Path, marker: str) -> Path:
    path.mkdir()
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_text(marker)
    return path


def test_first_conversion_is_moved_into_place(tmp_path: Path) -> None:
    tmp = _folder(tmp_path / "m.tmp", "mine")
    target = tmp_path / "m"
    assert _publish(tmp, target) == target
    assert (target / "model.safetensors").read_text() == "mine" and not tmp.exists()


def test_a_complete_folder_from_another_process_is_kept(tmp_path: Path) -> None:
    target = _folder(tmp_path / "m", "theirs")  # may already be loading elsewhere
    tmp = _folder(tmp_path / "m.tmp", "mine")
    assert _publish(tmp, target) == target
    assert (target / "model.safetensors").read_text() == "theirs"


def test_an_incomplete_folder_from_a_crash_is_replaced(tmp_path: Path) -> None:
    target = tmp_path / "m"
    target.mkdir()
    (target / "config.json").write_text("{}")  # weights never written
    tmp = _folder(tmp_path / "m.tmp", "mine")
    _publish(tmp, target)
    assert (target / "model.safetensors").read_text() == "mine"
