"""``calibrate`` subcommand: measure the model's full latency curve once, and store it.

A generation never waits for this measurement: without a stored curve it starts from a
quick probe of two forwards and refines it from its own steps. The full measurement
(fifteen to twenty-five seconds for the default model on two cores) times every
forward size in every variant and picks the fastest linear layout and attention per
size, which the probe cannot; every later process on this machine uses it as stored.
``--show`` prints the stored curve and where its seconds came from, measuring nothing.

With ``--engine`` naming an engine that compiles its step (``auto``, ``compiled``,
``uniform-compiled``), the step's shapes are compiled too, once, for a one-token prompt
(``--capacity`` sizes the cache they are compiled for): what compiling produced is kept in
the store of compiled steps, so a later process that runs that engine only traces.
``--clear-compiled`` empties that store and does nothing else.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .arguments import add_engine_flags, add_model_flags, add_quantize_flag, engine_flags

EAGER_ENGINES = ("eager", "static", "uniform")  # engines with no compiled step


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``calibrate`` on the CLI's subparsers."""
    p = subparsers.add_parser(
        "calibrate", help="measure and store the model's latency curve on this machine",
        description="Time the model's verification forwards at every draft size (the "
                    "draft budget's cost curve and the fastest variant per size) and "
                    "store the result for every later run on this machine.")
    add_model_flags(p)
    add_engine_flags(p, note="after the curve, an engine that compiles (auto, compiled, "
                     "uniform-compiled) compiles its step's shapes")
    add_quantize_flag(p)
    p.add_argument("--show", action="store_true",
                   help="print the stored curve and its source; measure nothing")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--clear-compiled", action="store_true",
                   help="delete every stored compiled step (<cache>/compiled) and exit")
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.clear_compiled:
        return _clear_compiled()
    from ..engine import engine_for
    from ..loading import load_model

    engine_name, capacity = engine_flags(args)  # before the load
    model, _ = load_model(args.model, device=args.device, dtype=args.dtype,
                          quantization=args.quantize)
    engine = engine_for(model)
    if args.show:
        curve, path = engine.stored_curve()
    else:
        print("measuring the latency curve (about half a minute on two cores) ...",
              file=sys.stderr, flush=True)
        path = engine.calibrate()
        curve = engine.curve
        if path is None:
            print("warning: the latency cache is not writable; the curve was not stored",
                  file=sys.stderr)
    compiled = None if args.show else _compile_step(model, engine_name, capacity)
    if args.json:
        print(json.dumps({**_document(curve, path), "compile": compiled}))
        return 0
    print(_table(curve, path))
    if compiled is not None:
        print(f"compiled the {compiled['engine']} engine's step shapes in "
              f"{compiled['seconds']:.1f} s")
    return 0


def _clear_compiled() -> int:
    from ..engine.compiling import artifacts

    count = artifacts.clear()
    print(f"deleted {count} stored compiled step set(s) from {artifacts.store_dir()}")
    return 0


def _compile_step(model: Any, name: str, capacity: int | None) -> dict | None:
    """Compile the step shapes of engine ``name``: ``{"engine", "seconds"}``, or
    ``None`` when it has none to compile here (``auto`` where it stays eager). The
    engine stores what it compiles, so the seconds are paid here rather than by the
    first answers of a later process."""
    if name in EAGER_ENGINES:
        return None
    from ..engine.choice import make_engine

    seconds = make_engine(model, name, capacity).warm_up([1], 1)
    if seconds == 0.0:  # the engine's word for "nothing to do"
        return None
    return {"engine": name, "seconds": round(seconds, 3)}


def _document(curve, path: Path | None) -> dict:
    """The curve as one JSON object (``stored``: false when there is none)."""
    doc: dict = {"path": str(path) if path is not None else None, "stored": curve is not None}
    if curve is not None:
        doc.update(source=curve.source, pack_single=curve.pack_single,
                   seconds={str(q): s for q, s in sorted(curve.seconds.items())},
                   layouts={str(q): curve.layout(q) for q in sorted(curve.seconds)})
    return doc


def _table(curve, path: Path | None) -> str:
    """Milliseconds and layout per forward size, then the source and the file."""
    where = str(path) if path is not None else "(not stored)"
    if curve is None:
        return f"no stored latency curve for this model on this machine ({where})"
    lines = [f"{'tokens':>6}  {'ms':>8}  layout"]
    lines += [f"{q:>6}  {s * 1e3:>8.2f}  {curve.layout(q)}"
              for q, s in sorted(curve.seconds.items())]
    lines.append(f"source: {curve.source}; a plain step's attention "
                 f"{'packed' if curve.pack_single else 'stock'}")
    lines.append(f"stored in {where}")
    return "\n".join(lines)
