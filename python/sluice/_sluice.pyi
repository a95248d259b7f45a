"""Type stubs for the Rust extension (``sluice._sluice``); the classes are re-exported by
``sluice``. See ``help(sluice)`` and the README's PyTorch section."""

from os import PathLike
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from ._fields import Fields

class SluiceError(RuntimeError):
    """An error at run time from the Rust side (a worker refused the job, a unit failed on
    every worker, every sample of an epoch was skipped, ...), with its message."""

class Loader:
    """The Sluice client: this rank's batches, epoch after epoch, as ``(images, labels)``
    that speak DLPack. For tensors in dicts and DataLoader habits, use ``sluice.torch``.

    Bad arguments raise ``ValueError`` here, not at the first batch.
    """

    def __init__(
        self,
        dataset: Union[str, PathLike],
        workers: Union[None, str, Sequence[str]] = None,
        batch_size: int = 256,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        shuffle: Union[None, bool, str] = None,
        pipeline: str = "decode | random_resized_crop 224 | hflip 0.5",
        device: str = "cpu",
        token_file: Union[None, str, PathLike] = None,
        trust_cert: Union[None, str, PathLike] = None,
        threads: Optional[int] = None,
        drop_last: bool = False,
        ring_batches: int = 4,
        dtype: str = "uint8",
        mean: Optional[Tuple[float, float, float]] = None,
        std: Optional[Tuple[float, float, float]] = None,
        order: str = "plan",
        mix_units: Optional[int] = None,
        mix_buffer: Optional[int] = None,
        prefetch_next_epoch: bool = True,
        epochs: Optional[int] = None,
        fields: Union[None, str, Sequence[str]] = None,
        label: Optional[str] = "cls",
        max_field_bytes: int = 1 << 20,
        remainder: Optional[str] = None,
        same_host: str = "auto",
        same_host_dir: Union[None, str, PathLike] = None,
        connections_per_worker: int = 1,
        fail_on_bad_sample: bool = False,
        worker_wait: float = 30.0,
        hedge_after: float = 3.0,
        max_unit_samples: int = 64,
        lookahead: Optional[int] = None,
        num_classes: Optional[int] = None,
        allow_negative_labels: bool = False,
        max_decoded_bytes: Optional[int] = None,
        top_up: bool = False,
    ) -> None:
        """
        Args:
            dataset: a manifest (local path, or the http(s) URL of one a storage node serves:
                relative shard URLs resolve against it), or shards as paths, URLs or a brace
                pattern (``"shards/train-{000000..000127}.tar"``, described from their
                ``.idx`` sidecars).
            workers: ``sluice cpu`` workers, ``"host:port"`` or a list; ``None`` decodes in
                this process.
            batch_size: samples per batch (every rank gets the same number of batches).
            seed: the plan's and the augmentation's seed; the same seed gives the same
                batches, whatever happens to the workers.
            rank, world_size: this rank and the number of ranks (default ``RANK`` and
                ``WORLD_SIZE``, as torchrun sets them).
            shuffle: ``"global"`` (default, or ``True``), ``"local"`` (each rank keeps its
                shards, for node-local caches), ``"partial:Q"``, or ``"none"`` (or
                ``False``: evaluation; the manifest's samples in order, cut into one
                contiguous run per rank, the same every epoch and seed; with
                ``remainder="pad"`` every sample is delivered exactly once on any number of
                ranks).
            pipeline: the CPU pipeline, e.g. ``"decode | random_resized_crop 224 | hflip
                0.5"``; it must end at a fixed output size. Every op, its arguments and
                defaults: ``docs/pipeline.md``.
            device: ``"cpu"`` (host batches) or ``"cuda:N"`` (a build with CUDA: a
                page-locked ring, each batch uploaded one ahead on the loader's stream).
            token_file: the cluster token for remote workers, on the file's first line
                (else ``$SLUICE_TOKEN``); an empty one is refused.
            trust_cert: a PEM with the workers' certificates or their CA.
            threads: decode threads when decoding in process (default: this machine's
                cores divided by ``LOCAL_WORLD_SIZE``).
            drop_last: drop the last, short batch of an epoch.
            ring_batches: batch buffers; a consumer holds at most ``ring_batches - 1``.
            dtype, mean, std: with ``device="cuda:N"``, convert on the GPU to normalized
                ``"float16"``/``"float32"`` NCHW.
            order: ``"plan"`` (reproducible batches) or ``"arrival"`` (as samples come).
            mix_units, mix_buffer: the plan's interleave window (units) and shuffle buffer
                (samples).
            prefetch_next_epoch: start epoch e + 1 while epoch e drains.
            epochs: how many epochs the job reads (the one after the last is not started).
            fields: non-image fields each batch carries (``["txt", "json"]``, ``"all"``);
                ``images.fields`` decodes them by extension.
            label: where labels come from (``"cls"``, any integer field,
                ``"json:category_id"``), or ``None`` for unlabeled data (every label -1). A
                sample whose label is missing, not an integer, negative or (with
                ``num_classes``) out of range is skipped by name; when the
                first samples of an epoch are all skipped (a label the data does not have),
                the epoch raises before handing out a batch. A batch whose every sample was
                skipped is never handed out.
            max_field_bytes: a requested field longer than this skips its sample by name.
            remainder: ``"pad"`` for evaluation (repeat a few samples, marked padding, so
                every sample is scored exactly once on any number of ranks), or ``"drop"``
                (the default: each rank reads the same number of samples, and up to
                ``world_size - 1`` are left out of the epoch). ``shuffle="none"`` without a
                ``remainder`` warns when samples would be left unscored.
            same_host: ``"auto"`` (shared memory with a worker on this machine that serves
                a socket in ``same_host_dir``, else QUIC; the log says why per worker),
                ``"off"`` or ``"require"``.
            same_host_dir: the folder a same-host worker's ``--same-host-dir`` names
                (default ``$SLUICE_SAME_HOST_DIR``, else ``/run/sluice``, the systemd
                unit's runtime directory).
            connections_per_worker: QUIC connections to each worker (1 to 16).
            fail_on_bad_sample: fail the unit on a bad sample instead of skipping it.
            worker_wait: seconds to wait for any worker before the epoch fails.
            hedge_after: seconds the next sample may be late before its unit is also sent to
                another worker.
            max_unit_samples: largest work unit, in samples.
            lookahead: plan order: how far ahead units start (default max(512, 2 x
                batch_size)).
            num_classes: labels must be below this; a sample whose label is not is skipped
                by name (default: any size).
            max_decoded_bytes: the most bytes one field's value may decode to (``npy``,
                ``npz``; default 8 x ``max_field_bytes``): a value that would expand past it
                raises ``FieldDecodeError`` naming the sample and field, never allocating it.
            top_up: keep batches full despite skipped samples: their places are filled
                with copies of the batch's own samples, marked in ``padding`` (as loadgen's
                ``--top-up``). Without it a batch with skips is shorter (never empty: a batch
                whose every sample was skipped is not handed out).
            allow_negative_labels: deliver negative labels (by default a sample with one is
                skipped by name: ``cross_entropy`` raises on -3 and silently ignores -100).
        """
    def epoch(self, epoch: int) -> Epoch:
        """The batches of ``epoch`` (resuming it when a checkpoint for it was loaded)."""
    def set_epoch(self, epoch: int) -> None:
        """The epoch plain iteration (``for images, labels in loader``) reads next."""
    def __iter__(self) -> Epoch: ...
    def __len__(self) -> int:
        """Batches per epoch, the same on every rank; for an epoch resumed at another world
        size, those handed out before the checkpoint plus this rank's share of the rest."""
    def state_dict(self) -> Dict[str, Any]:
        """The batches handed out so far in the current epoch (``{}`` before the first)."""
    def load_state_dict(self, state: Union[Dict[str, Any], List[Dict[str, Any]]]) -> None:
        """Resumes a checkpoint; a list of every rank's states resumes at another world
        size. ``{}`` means the start of the epoch."""
    def stats(self) -> Dict[str, Any]:
        """Live figures: batches, samples, samples_per_s, starved_fraction, workers."""
    @property
    def dataset_identity(self) -> Dict[str, Any]:
        """``{"fingerprint", "shards", "samples", "rank", "world_size"}``: the dataset as this
        rank sees it (every rank of a job must agree on the fingerprint)."""

class Epoch:
    """One epoch's batches."""

    def __iter__(self) -> Iterator[Tuple[Images, Labels]]: ...
    def __next__(self) -> Tuple[Images, Labels]: ...
    def __len__(self) -> int:
        """Batches this epoch yields (after a resume, the rest)."""
    def report(self) -> Dict[str, int]:
        """planned, delivered, skipped, batches, duplicates_dropped so far."""

class Images:
    """A batch's images (N×H×W×3, or N×3×H×W with a ``chw`` pipeline), through DLPack
    (``torch.from_dlpack``, ``numpy.from_dlpack``), and what comes with each row."""

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None,
                   dl_device: Any = None, copy: Optional[bool] = None) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def __len__(self) -> int: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def shape(self) -> List[int]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def ids(self) -> List[Tuple[int, int]]:
        """(shard index, sample index) of each row."""
    @property
    def keys(self) -> List[str]:
        """Each row's key (WebDataset's ``__key__``)."""
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
        bool}``; see ``sluice.transform_boxes``."""

class Labels:
    """A batch's int64 labels, through DLPack, beside its images."""

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None,
                   dl_device: Any = None, copy: Optional[bool] = None) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def __len__(self) -> int: ...
    @property
    def data_ptr(self) -> int: ...
