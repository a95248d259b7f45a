"""A batch's non-image fields, decoded by extension as WebDataset decodes them.

Each field is decoded the first time it is read, so a field whose bytes are bad for their
extension (invalid UTF-8 in ``txt``, broken JSON) raises :class:`FieldDecodeError` naming the
sample's key and the field only when that field is read; the other fields of the batch, and
the loader, are unaffected.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterator, List, Optional

__all__ = ["Fields", "FieldDecodeError", "decode_field"]

_log = logging.getLogger("sluice")

TEXT = frozenset({"txt", "text", "transcript"})
INTEGER = frozenset({"cls", "cls2", "class", "count", "index", "inx", "id"})
JSON = frozenset({"json", "jsn"})


class FieldDecodeError(ValueError):
    """A field's bytes are not valid for its extension; names the sample and the field."""


def _npy(data: bytes) -> Any:
    import numpy as np

    # Never unpickle: the bytes come from a dataset, and pickles run code.
    return np.load(io.BytesIO(data), allow_pickle=False)


def _npz(data: bytes) -> Any:
    import numpy as np

    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {name: z[name] for name in z.files}


def _decoder(name: str) -> Optional[Callable[[bytes], Any]]:
    """How a field is decoded, by the extension after its last dot (``seg.json`` → json)."""
    ext = name.rsplit(".", 1)[-1].lower()
    if ext in TEXT:
        return lambda b: b.decode("utf-8")
    if ext in INTEGER:
        return lambda b: int(b.decode("ascii").strip())
    if ext in JSON:
        return json.loads
    if ext == "npy":
        return _npy
    if ext == "npz":
        return _npz
    return None


def decode_field(name: str, data: Optional[bytes], key: str = "?") -> Any:
    """One field's value: ``txt``/``text`` → ``str``, ``json`` → the parsed object,
    ``cls``/``cls2``/``index``/``id`` → ``int``, ``npy`` → ``numpy.ndarray``, ``npz`` → a dict
    of arrays, anything else → ``bytes``; ``None`` stays ``None`` (the sample lacks the
    field). Unlike WebDataset, pickles (``pyd``, ``pth``) stay bytes: unpickling data runs
    code."""
    if data is None:
        return None
    decode = _decoder(name)
    if decode is None:
        return data
    try:
        return decode(data)
    except Exception as e:  # the decoder's own error, named
        shown = data[:40]
        raise FieldDecodeError(
            f"sample {key!r}: field {name!r} is not valid for its extension "
            f"({type(e).__name__}: {e}; it starts {shown!r})"
        ) from e


class Fields(Mapping):
    """``{field: [value of each row]}`` for one batch: the fields the loader asked for,
    decoded by extension on first read (see :func:`decode_field`), ``None`` where a sample
    lacks the field. Raw bytes: ``images.field_bytes(name)``."""

    def __init__(self, images: Any) -> None:
        self._images = images
        self._names: List[str] = list(images.field_names)
        self._decoded: Dict[str, List[Any]] = {}
        self._columns: Dict[str, List[Any]] = {}

    def __getitem__(self, name: str) -> List[Any]:
        if name not in self._decoded:
            if name not in self._names:
                raise KeyError(
                    f"{name!r}: this batch carries the fields {self._names} (ask the loader "
                    f"for it with fields=[...])"
                )
            keys = self._images.keys
            raw = self._images.field_bytes(name)
            self._decoded[name] = [decode_field(name, b, k) for b, k in zip(raw, keys)]
        return self._decoded[name]

    def column(self, name: str) -> List[Any]:
        """``fields[name]``, except that a value that cannot be decoded is ``None``, with a
        warning on the ``sluice`` logger naming the sample and the field: one bad value costs
        one row, never the batch. (``sluice.torch`` builds its batch dicts with it.)"""
        if name in self._decoded:
            return self._decoded[name]
        if name not in self._names:
            return self[name]  # the KeyError naming the fields there are
        if name in self._columns:
            return self._columns[name]
        column = []
        for data, key in zip(self._images.field_bytes(name), self._images.keys):
            try:
                column.append(decode_field(name, data, key))
            except FieldDecodeError as e:
                _log.warning("%s; it is None in the batch", e)
                column.append(None)
        self._columns[name] = column
        return column

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"<sluice.Fields {self._names} of {len(self._images)} samples>"
