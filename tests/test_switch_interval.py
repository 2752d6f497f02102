"""The switch interval is short while any background compile runs, and put back after."""

from __future__ import annotations

import sys
import threading

import pytest

from ngram_trie_rag.engine.compiling.background_compile import BackgroundCompiler
from ngram_trie_rag.engine.compiling.switch_interval import (
    COMPILE_SWITCH_INTERVAL_S,
    short_switch_interval,
)


@pytest.fixture(autouse=True)
def default_interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def test_shortened_inside_and_put_back_after() -> None:
    with short_switch_interval():
        assert sys.getswitchinterval() == pytest.approx(COMPILE_SWITCH_INTERVAL_S)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_put_back_only_when_the_last_of_overlapping_compiles_ends() -> None:
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with short_switch_interval():
            entered.set()
            release.wait(30)

    thread = threading.Thread(target=other)
    thread.start()
    assert entered.wait(30)
    with short_switch_interval():
        pass  # this one ends first: the other compile still runs
    assert sys.getswitchinterval() == pytest.approx(COMPILE_SWITCH_INTERVAL_S)
    release.set()
    thread.join(30)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_a_shorter_interval_or_a_change_made_meanwhile_is_left_alone() -> None:
    sys.setswitchinterval(1e-5)
    with short_switch_interval():
        assert sys.getswitchinterval() == pytest.approx(1e-5)
    assert sys.getswitchinterval() == pytest.approx(1e-5)
    sys.setswitchinterval(0.005)
    with short_switch_interval():
        sys.setswitchinterval(0.002)  # the application's own choice, made during a compile
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_the_background_compiler_compiles_under_the_short_interval() -> None:
    seen = []
    compiler = BackgroundCompiler(lambda key: seen.append(sys.getswitchinterval()))
    assert compiler.wait(256, timeout=30)
    assert seen == [pytest.approx(COMPILE_SWITCH_INTERVAL_S)]
    assert sys.getswitchinterval() == pytest.approx(0.005)
