"""Put a finished index folder at its target in one rename, keeping the user's own files.

A save writes the new index into ``.NAME.tmp-XXXXXXXX`` beside the target, then:

1. ``target -> .NAME.old-XXXXXXXX`` and ``tmp -> target`` (two renames: atomic each, a
   window of microseconds between them where the target is absent);
2. every entry of the old folder that the old index does not own (a user's notes, a
   ``src/`` folder) is renamed back into the new one: one rename per top-level entry,
   whatever it holds;
3. the old index's own files are deleted by name and the emptied folder removed with
   ``rmdir``, which fails rather than delete anything it did not expect.

Nothing is ever deleted recursively. A crash leaves the previous index at the target
(before step 1) or the new one with the user's entries (after step 2); in between, the
entries wait in ``.NAME.old-*``, and :func:`recover` (run by the next save, under the build
lock) puts them back, or puts the whole previous folder back when the target is missing.
Temporary folders of a dead save hold only index files and are removed the same way.
"""

from __future__ import annotations

import os
import re
import uuid
import warnings
from collections.abc import Collection
from pathlib import Path


def _sibling(target: Path, kind: str) -> Path:
    return target.parent / f".{target.name}.{kind}-{uuid.uuid4().hex[:8]}"


def new_tmp(target: Path) -> Path:
    """A new empty temporary folder beside ``target`` (same filesystem: renames work)."""
    tmp = _sibling(target, "tmp")
    tmp.mkdir()
    return tmp


def _leftovers(target: Path, kind: str) -> list[Path]:
    pattern = re.compile(rf"\.{re.escape(target.name)}\.{kind}-[0-9a-f]{{8}}")
    if not target.parent.is_dir():
        return []
    return sorted(p for p in target.parent.iterdir()
                  if pattern.fullmatch(p.name) and p.is_dir() and not p.is_symlink())


def publish(tmp: Path, target: Path, owned: Collection[str]) -> None:
    """Rename the finished folder ``tmp`` to ``target``. An existing ``target`` must be an
    index whose own files are ``owned`` (or an empty folder): those are replaced, every
    other entry in it is kept. On failure before the new folder is in place, the previous
    one is back at ``target`` and the exception propagates."""
    if not target.exists():
        tmp.rename(target)
        return
    old = _sibling(target, "old")
    target.rename(old)
    try:
        tmp.rename(target)
    except BaseException:
        old.rename(target)
        raise
    _return_entries(old, target, owned)


def _return_entries(old: Path, target: Path, owned: Collection[str]) -> None:
    """Move what ``old`` holds besides the index's own files into ``target``, then delete
    those files and the folder; anything unexpected stays, with a warning."""
    for _ in range(3):  # again if something appeared in ``old`` meanwhile
        for entry in sorted(os.listdir(old)):
            if entry in owned:
                continue
            if os.path.lexists(target / entry):
                warnings.warn(f"kept {old / entry}: {target / entry} exists", stacklevel=3)
                continue
            os.rename(old / entry, target / entry)
        _delete_owned(old, owned)
        try:
            old.rmdir()
            return
        except OSError:
            continue
    warnings.warn(f"the previous index folder was kept as {old}: it holds entries that "
                  "could not be moved back", stacklevel=3)


def _delete_owned(folder: Path, owned: Collection[str]) -> None:
    """Delete the index's own files in ``folder``, by name; plain files only."""
    for name in owned:
        path = folder / name
        if path.is_file() and not path.is_symlink():
            path.unlink()


def recover(target: Path, owned: Collection[str]) -> None:
    """Finish what a killed save left beside ``target``: a set-aside previous folder goes
    back (whole, when the target is missing), a temporary folder loses its index files
    and is removed if that empties it. Call only while holding the build lock."""
    for old in _leftovers(target, "old"):
        if not os.path.lexists(target):
            old.rename(target)
        else:
            _return_entries(old, target, owned)
    for tmp in _leftovers(target, "tmp"):
        _delete_owned(tmp, owned)
        try:
            tmp.rmdir()
        except OSError:
            pass  # not only index files inside: not ours to delete
