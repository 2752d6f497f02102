"""A bound method over a copy of its code object, so that its compiled graphs are its own.

Dynamo keeps a code object's graphs in one list with a length limit, so engines that
compiled the same method crowded each other out after a few models and cache sizes (an
error with ``fullgraph=True``). Each engine compiles its own copy, running the same code.
"""

from __future__ import annotations

import itertools
import types

_CODE_COPIES = itertools.count(1)


def own_code(method):
    """``method`` bound to the same object, over a copy of its code object."""
    fn = method.__func__
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{next(_CODE_COPIES)}")
    return types.MethodType(types.FunctionType(code, fn.__globals__, code.co_name,
                                               fn.__defaults__, fn.__closure__), method.__self__)
