"""One host-to-device copy per step.

A verification step needs a few small host arrays on the device (ids, positions, the
tree's ancestor block). Uploaded one by one from pageable memory, each is a blocking copy
and a host sync of its own. Here they are packed into one preallocated int64 staging
buffer (pinned on CUDA) and sent with a single non-blocking copy into its device twin, so
the step's only sync is where the accepted path is read back.

On a CPU the staging buffer is the device buffer: no copy at all.
"""

from __future__ import annotations

import numpy as np
import torch


class Staging:
    """Pinned host buffer -> device buffer, one ``copy_(non_blocking=True)`` per upload.

    The tensors :meth:`upload` returns are views of the device buffer: valid until the
    next upload, which overwrites them (one step's inputs at a time).
    """

    def __init__(self, device: torch.device, size: int = 1 << 12) -> None:
        self.device = torch.device(device)
        self._event: torch.cuda.Event | None = None
        self._allocate(size)

    @torch.inference_mode(False)
    def _allocate(self, size: int) -> None:
        """Normal tensors, also when a step inside inference mode grows the buffer: a
        compiled step's guards tell an inference tensor from a normal one."""
        on_cpu = self.device.type == "cpu"
        pinned = self.device.type == "cuda"
        self._staging = torch.empty(size, dtype=torch.int64, pin_memory=pinned)
        self._host = self._staging.numpy()  # (size,) int64, written in place by each upload
        self._device = self._staging if on_cpu else torch.empty(size, dtype=torch.int64,
                                                                device=self.device)

    def upload(self, *arrays: np.ndarray) -> list[torch.Tensor]:
        """``arrays`` (integer or bool, any shapes) as int64 tensors of the same shapes on
        the device, through one copy."""
        total = sum(a.size for a in arrays)
        self._wait()
        if total > self._host.size:  # a step larger than any before: rare, never shrinks
            self._allocate(2 * total)
        offset, spans = 0, []
        for a in arrays:
            self._host[offset: offset + a.size] = a.ravel()
            spans.append((offset, a.size, a.shape))
            offset += a.size
        flat = self._device[:total]
        if self._device is not self._staging:
            flat.copy_(self._staging[:total], non_blocking=True)
            if self.device.type == "cuda":
                self._event = torch.cuda.Event()
                self._event.record()
        return [flat[o: o + size].view(shape) for o, size, shape in spans]

    def _wait(self) -> None:
        """Before the staging buffer is rewritten: the last copy out of it has finished.
        A step reads its result back after its upload, so this normally finds the copy
        done and does not wait."""
        if self._event is not None and not self._event.query():
            self._event.synchronize()
