"""Type stubs for the Rust extension (``sluice._sluice``); the classes are re-exported by
``sluice``. See ``help(sluice)`` and the README's PyTorch section."""

from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from ._fields import Fields

class SluiceError(RuntimeError):
    """An error at run time from the Rust side (a worker refused the job, a unit failed on
    every worker, every sample of an epoch was skipped, ...), with its message."""

class _Loader:
    """The Rust loader behind ``sluice.Loader`` (``python/sluice/_loader.py``), which is
    where the arguments and their documentation are."""

    def __init__(self, dataset: str, config: str, *, token: Optional[str] = None) -> None:
        """``config``: a ``LoaderConfig`` as JSON, every setting (validated; a mistake is a
        ``ValueError`` naming its key); ``token``: the cluster token as text, a secret kept
        out of it."""
    def epoch(self, epoch: int) -> Epoch: ...
    def set_epoch(self, epoch: int) -> None: ...
    @property
    def next_epoch(self) -> int: ...
    def __iter__(self) -> Epoch: ...
    def __len__(self) -> int: ...
    def state_dict(self) -> Dict[str, Any]: ...
    def load_state_dict(self, state: Union[Dict[str, Any], List[Dict[str, Any]]]) -> None: ...
    def stats(self) -> Dict[str, Any]: ...
    @property
    def dataset_identity(self) -> Dict[str, Any]: ...
    @property
    def samples_per_epoch(self) -> int: ...
    @property
    def sources(self) -> List[str]: ...
    @property
    def config(self) -> str: ...

class Epoch:
    """One epoch's batches."""

    def __iter__(self) -> Iterator[Tuple[Images, Labels]]: ...
    def __next__(self) -> Tuple[Images, Labels]: ...
    def __len__(self) -> int:
        """Batches this epoch yields (after a resume, the rest)."""
    def report(self) -> Dict[str, Any]:
        """planned, delivered, skipped, batches, duplicates_dropped, reassigned (units a lost
        worker held that went to another), hedged (units a slow worker held that another also
        ran) so far; per_source (each
        source's delivered samples), storage_bytes and cached_bytes (shard bytes read from
        storage and from the workers' caches)."""

class Tensor:
    """One half of a batch (its images or its labels) exported through DLPack
    (``torch.from_dlpack``, ``numpy.from_dlpack``) without a copy, in host memory or on the
    batch's GPU."""

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None,
                   dl_device: Any = None, copy: Optional[bool] = None) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def shape(self) -> List[int]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def device(self) -> str: ...

class Images(Tensor):
    """A batch's images (N×H×W×3, or N×3×H×W with a ``chw`` pipeline), and what comes with
    each row."""

    def __len__(self) -> int: ...
    @property
    def ids(self) -> List[Tuple[int, int]]:
        """(shard index, sample index) of each row."""
    @property
    def keys(self) -> List[str]:
        """Each row's key (WebDataset's ``__key__``)."""
    @property
    def source(self) -> List[int]:
        """Each row's source: its place in the loader's ``sources`` (0 for one dataset)."""
    @property
    def padding(self) -> List[bool]:
        """Rows that repeat a sample (remainder "pad", or a batch topped up)."""
    @property
    def skipped(self) -> List[Tuple[Tuple[int, int], str]]:
        """Samples of this batch that were skipped, with why."""
    @property
    def index(self) -> int:
        """The batch's position in its epoch."""
    @property
    def field_names(self) -> List[str]: ...
    @property
    def max_decoded_bytes(self) -> int:
        """The most bytes one field's value may decode to (the loader's setting)."""
    def field_bytes(self, name: str) -> List[Optional[bytes]]:
        """Field ``name`` of each row, raw; ``None`` where the sample lacks it."""
    @property
    def fields(self) -> Fields:
        """``{field: [value of each row]}``, decoded by extension on first read."""
    @property
    def geometry(self) -> List[Dict[str, Any]]:
        """Per row ``{"source": (h, w), "box": (x0, y0, x1, y1), "size": (h, w), "flip":
        bool}`` (a clip's adds ``"frames"``); see ``sluice.transform_boxes``."""
    @property
    def frames(self) -> Optional[List[List[int]]]:
        """A batch of clips: each row's source frame indices; ``None`` for images."""

class Labels(Tensor):
    """A batch's int64 labels, beside its images."""

    def __len__(self) -> int: ...

def serve_metrics(addr: str = "127.0.0.1:0") -> str: ...
