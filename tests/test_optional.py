"""A missing optional package is a one-line error naming the feature and the fix."""

from __future__ import annotations

import json
import sys

import pytest

from ngram_trie_rag.util.optional import require


def test_a_present_package_is_returned() -> None:
    assert require("json", "parsing", "json", "-") is json


def test_a_missing_package_names_the_feature_and_the_install_command(tmp_path) -> None:
    with pytest.raises(ImportError, match=r"^grammars needs xgrammar: pip install x$"):
        require("no_such_package_here", "grammars", "xgrammar", "pip install x")
    (tmp_path / "shadowed_pkg").mkdir()  # a bare folder imports as a namespace package
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ImportError, match="needs the real one"):
            require("shadowed_pkg", "it", "the real one", "pip install it", has="Engine")
    finally:
        sys.path.remove(str(tmp_path))
