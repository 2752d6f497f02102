"""``calibrate`` subcommand: measure the model's full latency curve once, and store it.

A generation never waits for this measurement: without a stored curve it starts from a
quick probe of two forwards and refines it from its own steps. The full measurement
(fifteen to twenty-five seconds for the default model on two cores) times every
forward size in every variant and picks the fastest linear layout and attention per
size, which the probe cannot; every later process on this machine uses it as stored.
``--show`` prints the stored curve and where its seconds came from, measuring nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .arguments import add_model_flags


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``calibrate`` on the CLI's subparsers."""
    p = subparsers.add_parser(
        "calibrate", help="measure and store the model's latency curve on this machine",
        description="Time the model's verification forwards at every draft size (the "
                    "draft budget's cost curve and the fastest variant per size) and "
                    "store the result for every later run on this machine.")
    add_model_flags(p)
    p.add_argument("--show", action="store_true",
                   help="print the stored curve and its source; measure nothing")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from ..engine import engine_for
    from ..loading import load_model

    model, _ = load_model(args.model, device=args.device, dtype=args.dtype)
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
    print(json.dumps(_document(curve, path)) if args.json else _table(curve, path))
    return 0


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
