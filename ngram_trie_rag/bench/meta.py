"""The run's circumstances, stored beside its numbers so results can be compared honestly."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import sys

import torch
import transformers

from ..generator import SpeculativeGenerator


def command_line(command: str | None) -> str:
    """The given command, else how this process was started (``python -m`` spelled out)."""
    if command is not None:
        return command
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        program = ["python", "-m", spec.name.removesuffix(".__main__")]
    else:
        program = [os.path.basename(sys.argv[0])]
    return shlex.join([*program, *sys.argv[1:]])


def environment(gen: SpeculativeGenerator) -> dict:
    """Model, dtype, device, threads, library versions and machine."""
    from ..engine.quant import model_bytes, quantization_of
    from ..engine.quant.apply import SUMMARY

    model = gen.model
    device = model.device
    summary = getattr(model, SUMMARY, None)
    meta = {
        "model": gen.model_name,
        "model_type": getattr(model.config, "model_type", None),
        "parameters": summary["parameters"] if summary else sum(
            p.numel() for p in model.parameters()),
        "dtype": str(model.dtype).removeprefix("torch."),
        "quantization": quantization_of(model),
        "weights_bytes": model_bytes(model),  # parameters and buffers, as loaded
        "device": str(device),
        "engine": gen.engine.describe().label(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        },
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        meta["machine"]["gpu"] = torch.cuda.get_device_name(device)
    return meta
