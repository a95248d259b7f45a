"""``sluice.Loader``: the keyword arguments a user passes, turned once into the Rust
loader's settings (``LoaderConfig``, deserialized on the Rust side, which validates them and
names the key of any mistake). The signature below is the argument list; there is no other.
"""

from __future__ import annotations

import json
import os
import warnings
from os import PathLike
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _env
from ._sluice import Epoch, _Loader

DEFAULT_PIPELINE = "decode | random_resized_crop 224 | hflip 0.5"

#: DataLoader keywords Sluice does not take, and the Sluice way of saying them.
_DATALOADER_HABITS = {
    ("num_workers", "persistent_workers", "prefetch_factor", "worker_init_fn"):
        "decoding runs in sluice cpu workers (workers=[\"host:port\", ...]) or in this "
        "process (threads=N decode threads); there are no DataLoader worker processes",
    ("pin_memory", "pin_memory_device"):
        "device=\"cuda:N\" keeps the batch ring page-locked and uploads each batch on its "
        "own stream; host batches (device=\"cpu\") are ordinary memory",
    ("sampler", "batch_sampler", "generator"):
        "Sluice plans each epoch itself: seed=, shuffle=, and rank/world_size (from "
        "torch.distributed, or RANK and WORLD_SIZE, by default)",
    ("collate_fn",):
        "batches are already tensors (torch.from_dlpack(images)) with images.keys, "
        "images.fields and labels beside them",
    ("timeout",): "worker_wait= is how long to wait for a worker (seconds)",
}


def _unknown_keyword(key: str) -> TypeError:
    for keys, hint in _DATALOADER_HABITS.items():
        if key in keys:
            return TypeError(f"Loader() takes no '{key}': {hint}")
    return TypeError(f"Loader() got an unexpected keyword argument '{key}'")


def _floats(key: str, value: Any) -> Optional[List[float]]:
    """``None``, or three numbers (a channel each; any sequence, a tensor's included)."""
    if value is None:
        return None
    try:
        numbers = [float(v) for v in value]
    except (TypeError, ValueError):
        raise ValueError(f"{key}: expected three numbers, got {value!r}") from None
    return numbers


def _names(key: str, value: Any, what: str) -> List[str]:
    """``None``, one name, or a list of names, as a list."""
    if value is None:
        return []
    if isinstance(value, (str, PathLike)):
        return [os.fspath(value)]
    try:
        names = [os.fspath(v) for v in value]
    except TypeError:
        raise ValueError(f"{key}: expected {what}, got {value!r}") from None
    return names


#: What ``dataset=`` takes: one dataset, or a mixture's ``(dataset, weight)`` pairs.
DatasetArg = Union[str, PathLike, Sequence[Tuple[Union[str, PathLike], float]]]


def _sources(dataset: Any) -> Tuple[str, Optional[List[Tuple[str, float]]]]:
    """``dataset=`` as (a name, a mixture's (dataset, weight) pairs or ``None``)."""
    if isinstance(dataset, (str, PathLike)):
        return os.fspath(dataset), None
    bad = ValueError(
        "dataset: expected a manifest, shards or a mixture file (.toml), or a list of "
        f"(dataset, weight) pairs such as [(\"a.json\", 0.7), (\"b.json\", 0.3)], got "
        f"{dataset!r}")
    try:
        pairs = [(os.fspath(d), float(w)) for d, w in dataset]
    except (TypeError, ValueError):
        raise bad from None
    if not pairs:
        raise bad
    return "+".join(d for d, _ in pairs), pairs


def _shuffle(shuffle: Any) -> Any:
    """``True``/``None``: global; ``False``: none; text as given."""
    if shuffle is None or shuffle is True:
        return "global"
    if shuffle is False:
        return "none"
    return shuffle


def _schedule(points: Any, interpolate: str) -> Any:
    """``weight_schedule`` as the loader's config has it (``None`` without one)."""
    if interpolate not in ("step", "linear"):
        raise ValueError(f'schedule_interpolate: expected "step" or "linear", got {interpolate!r}')
    if points is None:
        return None
    try:
        written = [{"step": int(step), "weights": [float(w) for w in weights]}
                   for step, weights in points]
    except (TypeError, ValueError) as e:
        raise ValueError(
            "weight_schedule: expected [(step, [weight, ...]), ...], e.g. "
            f"[(0, [0.8, 0.2]), (1000, [0.5, 0.5])] ({e})") from None
    return {"points": written, "interpolate": interpolate}


def _seconds(value: Any) -> Any:
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


class Loader:
    """The Sluice client: this rank's batches, epoch after epoch, as ``(images, labels)``
    that speak DLPack. For tensors in dicts and DataLoader habits, use ``sluice.torch``.

    Bad arguments raise ``ValueError`` here, naming the argument, not at the first batch.

    Args:
        dataset: a manifest (local path, or the http(s) URL of one a storage node serves:
            relative shard URLs resolve against it), or shards as paths, URLs or a brace
            pattern (``"shards/train-{000000..000127}.tar"``, described from their
            ``.idx`` sidecars). A mixture: ``(dataset, weight)`` pairs, ``[("web.json",
            0.7), ("curated.json", 0.3)]``, or a mixture file (``.toml``: ``[[sources]]``
            with ``dataset`` and ``weight``). Each source is drawn without replacement
            within a pass, a source that runs out starts a new pass (a small source is
            upsampled by its weight), and the weights hold within every few batches;
            ``images.source`` says each sample's source. A checkpoint may be resumed with
            other weights: each source's pass goes on, nothing repeated or skipped within
            it (``docs/mixtures.md``).
        epoch_samples: samples per epoch of a mixture (default: all its sources').
        mixture_round_samples: samples each rank of a mixture plans at once (default
            1,048,576, whole batches): a longer epoch is read a round at a time, so
            ``epoch_samples=10**9`` starts in seconds and in the memory of one round.
        weight_schedule: a mixture's weights by training step instead of fixed ones:
            ``[(step, [w0, w1, ...]), ...]``, steps increasing (a mixture file's
            ``[schedule]``). The step is the training loop's: epoch ``e``'s ``b``-th batch is
            step ``e × len(loader) + b``. Applied at batch boundaries, the same on every rank,
            kept across checkpoints and world sizes; each source's pass stays whole.
        schedule_interpolate: ``"step"`` (each point's weights until the next point) or
            ``"linear"`` (a straight line from one point's to the next's).
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
        same_host_uid: the user id same-host workers run as (default: this process's own,
            or the owner of a socket folder only its owner can write, as the systemd unit's
            ``/run/sluice``). A socket owned by, or served by a process of, any other user but
            root is refused before the token or any memory is sent, and QUIC is used instead.
        connections_per_worker: QUIC connections to each worker (1 to 16).
        io_threads: threads that receive samples and fill batches (1 to 16). One costs
            10-15% less CPU per sample than two over QUIC and carries about 10,000
            samples/s of 224x224x3 a rank on a small VM. Default (``None``): one, or
            ``connections_per_worker`` when that is above one.
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
        job_name: this training job's name on the workers, the same on every rank
            (default ``"<dataset>@<hostname>"``): a worker shares its decode slots fairly
            among the jobs it serves by name, and labels its per-job metrics with it.
        job_weight: the job's share of a busy worker against other jobs' (1: equal; a
            worker caps it at its ``limits.max_job_weight``).
        share: let workers decode once for a sweep (default ``True``): jobs of one team
            reading the same samples with the same pipeline and seed (say, four learning
            rates) are served tensors decoded for one of them, each job still exactly once,
            in its own order, never waiting for another. The batches are the same either
            way; ``False`` has every worker decode this job's samples for it alone.
        workers_file: a file of workers, one ``host:port`` a line (``#`` comments), re-read
            while epochs run: a worker added to it gets units within ``workers_refresh``
            seconds, one removed from it is drained (its open units finish, it gets no new
            ones). With ``workers=`` too, the pool is both. A name in either that is not an
            address (a Kubernetes headless Service) is re-resolved as often, each of its
            records a worker. The batches are the same whatever joins or leaves; the
            ``sluice`` logger says when the pool changes, and ``stats()["pool_changes"]``
            counts it.
        workers_refresh: seconds between re-reads of ``workers_file`` and re-resolutions
            of worker names (default 1).
    """

    def __init__(
        self,
        dataset: DatasetArg,
        workers: Union[None, str, Sequence[str]] = None,
        batch_size: int = 256,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        shuffle: Union[None, bool, str] = None,
        pipeline: str = DEFAULT_PIPELINE,
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
        same_host_uid: Optional[int] = None,
        connections_per_worker: int = 1,
        io_threads: Optional[int] = None,
        fail_on_bad_sample: bool = False,
        worker_wait: float = 30.0,
        hedge_after: float = 3.0,
        max_unit_samples: int = 64,
        lookahead: Optional[int] = None,
        num_classes: Optional[int] = None,
        allow_negative_labels: bool = False,
        max_decoded_bytes: Optional[int] = None,
        top_up: bool = False,
        epoch_samples: Optional[int] = None,
        mixture_round_samples: Optional[int] = None,
        weight_schedule: Optional[Sequence[Tuple[int, Sequence[float]]]] = None,
        schedule_interpolate: str = "step",
        job_name: Optional[str] = None,
        job_weight: int = 1,
        share: bool = True,
        workers_file: Union[None, str, PathLike] = None,
        workers_refresh: float = 1.0,
        **kwargs: Any,
    ) -> None:
        if kwargs:
            raise _unknown_keyword(next(iter(kwargs)))
        rank, world_size = _env.rank_and_world(rank, world_size, _env.distributed())
        workers = _names("workers", workers, '"host:port" or a list of them')
        mixing = {"window_units": mix_units, "buffer_samples": mix_buffer}
        name, sources = _sources(dataset)
        remote = bool(workers) or workers_file is not None
        if not remote and threads is None:
            threads = _env.threads_per_rank()
        config: Dict[str, Any] = {
            "dataset_name": name,
            "workers": workers,
            "pipeline": pipeline,
            "batch_size": batch_size,
            "seed": seed,
            "rank": rank,
            "world_size": world_size,
            "shuffle": _shuffle(shuffle),
            "remainder": remainder,
            "max_unit_samples": max_unit_samples,
            "order": order,
            "mixing": {k: v for k, v in mixing.items() if v is not None},
            "lookahead": lookahead,
            "hedge_after": _seconds(hedge_after),
            "labels": {"allow_negative": allow_negative_labels, "num_classes": num_classes},
            "last_batch": "drop" if drop_last else "partial",
            "short_batch": "top_up" if top_up else "deliver",
            "fail_on_bad_sample": fail_on_bad_sample,
            "fields": _names("fields", fields, '"all", a field name or a list of names'),
            "max_field_bytes": max_field_bytes,
            "token_file": None if token_file is None else os.fspath(token_file),
            "trust_cert": None if trust_cert is None else os.fspath(trust_cert),
            "connections_per_worker": connections_per_worker,
            "io_threads": io_threads,
            "ring_batches": ring_batches,
            "worker_wait": _seconds(worker_wait),
            "same_host": same_host,
            "same_host_dir": None if same_host_dir is None else os.fspath(same_host_dir),
            "same_host_uid": same_host_uid,
            "prefetch_next_epoch": prefetch_next_epoch,
            "epochs": epochs,
            "epoch_samples": epoch_samples,
            "mixture_round_samples": mixture_round_samples,
            "weight_schedule": _schedule(weight_schedule, schedule_interpolate),
            "job_name": job_name,
            "job_weight": job_weight,
            "share": share,
            "workers_file": None if workers_file is None else os.fspath(workers_file),
            "workers_refresh": _seconds(workers_refresh),
            "device": None if device is None else str(device),
            "dtype": dtype,
            "mean": _floats("mean", mean),
            "std": _floats("std", std),
            "threads": threads,
            "max_decoded_bytes": max_decoded_bytes,
            "sources": None if sources is None else [d for d, _ in sources],
            "weights": None if sources is None else [w for _, w in sources],
        }
        # None means "the default" everywhere but the label, where it means "no label".
        config = {k: v for k, v in config.items() if v is not None}
        config["label"] = label
        self._inner = _Loader(
            name,
            json.dumps(config),
            token=_env.env_token(token_file) if remote else None,
        )
        if config["shuffle"] == "none" and remainder is None:
            self._warn_unscored()

    def _warn_unscored(self) -> None:
        """``shuffle="none"`` is for evaluation, where the default ``remainder="drop"``
        leaves samples unscored: say how many, and how to score them all."""
        identity = self._inner.dataset_identity
        world, total = identity["world_size"], identity["samples"]
        unread = total - self._inner.samples_per_epoch * world
        if unread > 0:
            warnings.warn(
                f'shuffle="none" with the default remainder="drop": {unread} of the dataset\'s '
                f"{total} samples are not read at world_size {world}; pass remainder=\"pad\" "
                "to score every sample once (padding rows are marked), or remainder=\"drop\" "
                "to keep this",
                UserWarning,
                stacklevel=3,
            )

    def epoch(self, epoch: int) -> Epoch:
        """The batches of ``epoch`` (resuming it when a checkpoint for it was loaded). The
        epoch keeps its loader alive: ``for b in sluice.Loader(...).epoch(0)`` reads it
        whole."""
        return self._inner.epoch(epoch)

    def set_epoch(self, epoch: int) -> None:
        """The epoch plain iteration (``for images, labels in loader``) reads next."""
        self._inner.set_epoch(epoch)

    @property
    def next_epoch(self) -> int:
        """The epoch plain iteration reads next: ``set_epoch``'s, or after
        ``load_state_dict`` the state's (the one after it for a state taken once its epoch
        had handed out every batch)."""
        return self._inner.next_epoch

    def __iter__(self) -> Iterator[Any]:
        return iter(self._inner)

    def __len__(self) -> int:
        """Batches per epoch, the same on every rank; for an epoch resumed at another world
        size, those handed out before the checkpoint plus this rank's share of the rest."""
        return len(self._inner)

    def state_dict(self) -> Dict[str, Any]:
        """The batches handed out so far in the current epoch (``{}`` before the first)."""
        return self._inner.state_dict()

    def load_state_dict(self, state: Union[Dict[str, Any], List[Dict[str, Any]]]) -> None:
        """Resumes a checkpoint; the next ``epoch(e)`` (or iteration) resumes it. A list of
        every rank's states taken at the same step also resumes at another world size (plan
        order: one rank's state is enough). A state taken once its epoch had handed out every
        batch resumes at the start of the next epoch (``next_epoch``). ``{}`` (the state
        before the first batch) forgets whatever was loaded or read: every epoch from its
        start. Until the next epoch starts, ``state_dict()`` gives the state loaded."""
        self._inner.load_state_dict(state)

    def stats(self) -> Dict[str, Any]:
        """Live figures: batches, samples, samples_per_s, starved_fraction, storage_bytes and
        cached_bytes (shard bytes the workers read from the storage tier and from their shard
        caches), cache_hit_ratio (``None`` before a unit finished), workers."""
        return self._inner.stats()

    @property
    def dataset_identity(self) -> Dict[str, Any]:
        """``{"fingerprint", "shards", "samples", "rank", "world_size"}``: the dataset as this
        rank sees it (every rank of a job must agree on the fingerprint)."""
        return self._inner.dataset_identity

    @property
    def sources(self) -> List[str]:
        """A mixture's sources, in the order ``images.source`` numbers them (``[]`` for a
        single dataset)."""
        return self._inner.sources

    @property
    def config(self) -> Dict[str, Any]:
        """Every setting of this loader as it was validated (defaults filled in)."""
        return json.loads(self._inner.config)

    def __repr__(self) -> str:
        identity = self.dataset_identity
        return (f"<sluice.Loader {identity['shards']} shards, {identity['samples']} samples, "
                f"rank {identity['rank']} of {identity['world_size']}>")
