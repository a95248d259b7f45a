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


#: The most bytes a value may decode to when no loader says otherwise (8 x the 1 MiB stored
#: limit): room for compressed arrays, not for a 1 MB ``.npz`` that is 1 GB of zeros.
DEFAULT_MAX_DECODED = 8 << 20


class _TooLarge(ValueError):
    pass


def _npy_size(f: Any) -> int:
    """Bytes the array whose ``.npy`` header ``f`` starts with would take, from the header
    alone."""
    import numpy as np

    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
    else:
        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    n = 1
    for d in shape:
        n *= int(d)
    return n * dtype.itemsize


def _check(size: int, limit: int, what: str) -> None:
    if size > limit:
        raise _TooLarge(f"{what} would decode to {size} bytes, over the limit of {limit} "
                        "(max_decoded_bytes)")


def _npy(data: bytes, limit: int = DEFAULT_MAX_DECODED) -> Any:
    import numpy as np

    _check(_npy_size(io.BytesIO(data)), limit, "the array")
    # Never unpickle: the bytes come from a dataset, and pickles run code.
    return np.load(io.BytesIO(data), allow_pickle=False)


def _npz(data: bytes, limit: int = DEFAULT_MAX_DECODED) -> Any:
    import zipfile

    import numpy as np

    # Every member's size from its header, before a byte of it is inflated.
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        total = 0
        for member in z.infolist():
            _check(member.file_size, limit, f"member {member.filename!r}")
            with z.open(member) as f:
                total += _npy_size(f)
            _check(total, limit, "the arrays")
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {name: z[name] for name in z.files}


def _decoder(name: str, limit: int = DEFAULT_MAX_DECODED) -> Optional[Callable[[bytes], Any]]:
    """How a field is decoded, by the extension after its last dot (``seg.json`` → json)."""
    ext = name.rsplit(".", 1)[-1].lower()
    if ext in TEXT:
        return lambda b: b.decode("utf-8")
    if ext in INTEGER:
        return lambda b: int(b.decode("ascii").strip())
    if ext in JSON:
        return json.loads
    if ext == "npy":
        return lambda b: _npy(b, limit)
    if ext == "npz":
        return lambda b: _npz(b, limit)
    return None


def decode_field(name: str, data: Optional[bytes], key: str = "?",
                 max_decoded_bytes: int = DEFAULT_MAX_DECODED) -> Any:
    """One field's value: ``txt``/``text`` → ``str``, ``json`` → the parsed object,
    ``cls``/``cls2``/``index``/``id`` → ``int``, ``npy`` → ``numpy.ndarray``, ``npz`` → a dict
    of arrays, anything else → ``bytes``; ``None`` stays ``None`` (the sample lacks the
    field). Unlike WebDataset, pickles (``pyd``, ``pth``) stay bytes: unpickling data runs
    code. An ``npy`` or ``npz`` whose arrays would take more than ``max_decoded_bytes`` is
    refused from its headers, before anything is allocated."""
    if data is None:
        return None
    decode = _decoder(name, max_decoded_bytes)
    if decode is None:
        return data
    try:
        return decode(data)
    except _TooLarge as e:
        raise FieldDecodeError(f"sample {key!r}: field {name!r}: {e}") from None
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
        self._limit: int = getattr(images, "max_decoded_bytes", DEFAULT_MAX_DECODED)

    def __getitem__(self, name: str) -> List[Any]:
        if name not in self._decoded:
            if name not in self._names:
                raise KeyError(
                    f"{name!r}: this batch carries the fields {self._names} (ask the loader "
                    f"for it with fields=[...])"
                )
            keys = self._images.keys
            raw = self._images.field_bytes(name)
            limit = self._limit
            self._decoded[name] = [decode_field(name, b, k, limit) for b, k in zip(raw, keys)]
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
                column.append(decode_field(name, data, key, self._limit))
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
