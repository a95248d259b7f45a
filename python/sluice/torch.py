"""Sluice batches as PyTorch tensors, in the dialects PyTorch code already speaks.

::

    from sluice.torch import Loader

    loader = Loader("shards/manifest.json", batch_size=256, fields=["txt"])
    for epoch in range(epochs):             # each iter() is the next epoch, as DataLoader
        for batch in loader:
            x = batch["image"]              # N×3×H×W uint8, contiguous (layout="nchw")
            y = batch["label"]              # int64
            captions = batch["txt"]         # one str per row (None where undecodable)

How it differs from ``torch.utils.data.DataLoader``:

- Iterating again after a finished epoch starts the next one (DataLoader reshuffles on every
  ``iter()``; so does this). ``loader.set_epoch(e)`` or ``loader.sampler.set_epoch(e)``
  (what Lightning and Accelerate call) choose the epoch the next ``iter()`` reads.
- A batch is a dict ``{"image", "label", "__key__", "padding", "geometry", <each requested
  field>}``, or a tuple of those keys with ``to_tuple=("image", "label")``. A field's values
  are decoded by extension, one by one: a value that cannot be decoded (a caption that is not
  UTF-8) is ``None`` in its row, with a warning on the ``sluice`` logger naming the sample, and
  the rest of the batch and the epoch go on. Asking for a field named like one of the batch's
  own keys is a ``ValueError``; with ``fields="all"``, a sample's field of such a name is
  under ``"field:<name>"`` (``batch["field:label"]``), so it never replaces the batch's own.
- With ``copy=False`` (the default) ``image`` and ``label`` are views of the loader's own
  buffers, which return to it once every tensor made from a batch is gone: keep at most
  ``ring_batches - 1`` batches alive. ``copy=True`` clones them, so batches may be kept (an
  evaluation loop collecting predictions).
- ``state_dict()``/``load_state_dict()`` are StatefulDataLoader's: the batches handed out so
  far; resuming delivers exactly the rest, also at another world size. Any one rank's state
  resumes every rank (what Lightning's ``ModelCheckpoint`` and Accelerate's ``save_state``
  store is rank 0's), since ranks step together; in ``order="arrival"`` each rank needs its
  own.
- Rank and world size come from ``torch.distributed`` when it is initialized (else ``RANK``
  and ``WORLD_SIZE``; explicit ``rank=``/``world_size=`` win), so Lightning's default launcher
  and ``accelerate launch`` need no arguments. A loader built before the process group (at
  the top of a Lightning script) takes them from it the first time it is used after.
- Under ``torch.distributed`` the ranks compare, once per loader, everything that decides
  which samples each gets and how many steps it takes (dataset, seed, shuffle, batch size,
  drop_last, remainder, world size, ...), and ``load_state_dict`` compares the epoch and
  resume point: ranks that differ would repeat and lose samples or hang at the epoch's end, so
  they all raise ``ValueError`` naming the first difference. These are collective calls: every
  rank builds its loader, and loads its state, at the same point (as frameworks do).
- It is not meant to run inside DataLoader worker processes: it decodes in its own threads or
  in ``sluice cpu`` workers. ``DataLoader(loader, batch_size=None)`` (``num_workers=0``)
  works. ``DataLoader(loader)`` (its default ``batch_size=1`` would batch the batches again)
  raises at ``len()`` or ``iter()``; with ``num_workers > 0`` it raises at ``iter()`` under
  "spawn" and "forkserver", and at the first batch under "fork" (the worker finds out), each
  naming the fix. A loader in a process
  that forks is safe (the child never tears down the parent's threads), and the last
  reference going (``del loader``) stops its prefetch and frees its buffers at once.
- Pickling (``copy.deepcopy``, a framework that copies dataloaders) rebuilds the loader from
  its arguments on first use; the copy starts at the same epoch with nothing read, and never
  repeats the ranks' collective check.

Every other argument is ``sluice.Loader``'s (see ``help(sluice.Loader)``).
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import sys
import warnings
import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch.utils.data import IterableDataset

from . import _env
from ._loader import DEFAULT_PIPELINE, Loader as _Loader, _shuffle

__all__ = ["Loader"]

_log = logging.getLogger("sluice")

#: The batch's own keys: no sample field may take their place.
RESERVED_KEYS = ("image", "label", "__key__", "__source__", "padding", "geometry", "frames")

#: What decides which samples a rank gets and how many steps it takes: every rank of a job
#: must agree on all of it (compared as ``sluice.Loader`` would take it, defaults filled in).
_AGREED = ("world_size", "seed", "shuffle", "batch_size", "drop_last", "remainder", "order",
           "mix_units", "mix_buffer", "max_unit_samples", "label", "weight_schedule",
           "schedule_interpolate", "mixture_round_samples")

#: ``sluice.Loader``'s defaults, from its signature (the one place they are written).
_DEFAULTS = {k: p.default for k, p in inspect.signature(_Loader.__init__).parameters.items()}


class _EpochSetter:
    """Stands where a DataLoader's sampler is: Lightning and Accelerate call
    ``loader.sampler.set_epoch(epoch)`` before each epoch. It holds the loader weakly, so the
    loader is freed as soon as its user lets go of it."""

    def __init__(self, loader: "Loader") -> None:
        self._loader = weakref.ref(loader)

    def set_epoch(self, epoch: int) -> None:
        loader = self._loader()
        if loader is not None:
            loader.set_epoch(epoch)


def _stages(pipeline: str) -> List[str]:
    """The op names of a pipeline string, in order (the grammar itself is the workers')."""
    return [stage.split()[0] for stage in pipeline.split("|") if stage.split()]


def _distributed() -> Any:
    """``torch.distributed`` when a process group is initialized, else ``None``."""
    return _env.distributed()


def _in_dataloader_workers(where: str) -> RuntimeError:
    return RuntimeError(
        f"sluice.torch.Loader {where}: each worker would read the whole epoch (every sample "
        "num_workers times), and a loader forked into a worker has none of its threads. It "
        "decodes in its own threads (threads=) or in sluice cpu workers (workers=), so it "
        "needs no DataLoader workers: iterate it directly, or wrap it as "
        "DataLoader(loader, batch_size=None) with num_workers=0"
    )


def _refuse_dataloader_worker() -> None:
    info = torch.utils.data.get_worker_info()
    if info is not None:
        raise _in_dataloader_workers(
            f"iterated in DataLoader worker {info.id} of {info.num_workers}"
        )


def _refuse_rebatching(where: str) -> None:
    """Raises if a DataLoader with a ``batch_size`` is the caller (its ``len()``, or its
    iterator's fetcher at ``iter()``): it would collate Sluice's batches into batches of them
    (``image`` of shape [1, N, 3, H, W] at DataLoader's default ``batch_size=1``)."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return
        # Only torch's own frames are looked into: reading another frame's locals keeps a
        # snapshot of them alive with it (a user's `del loader` would not free the loader).
        if "torch/utils/data" not in frame.f_code.co_filename.replace(os.sep, "/"):
            frame = frame.f_back
            continue
        for name in ("self", "loader"):
            dl = frame.f_locals.get(name)
            if isinstance(dl, torch.utils.data.DataLoader) and dl.batch_size is not None:
                raise ValueError(
                    f"sluice.torch.Loader {where} by DataLoader(batch_size={dl.batch_size}), "
                    "which would batch its batches again (image of shape "
                    f"[{dl.batch_size}, N, 3, H, W]): the loader makes its own batches "
                    "(batch_size= on the Loader), so wrap it as DataLoader(loader, "
                    "batch_size=None), or iterate it directly"
                )
        frame = frame.f_back


def _sent_to_dataloader_workers() -> bool:
    """Whether this pickling sends the loader to a DataLoader worker that is being started
    ("spawn" and "forkserver" pickle the dataset for each worker): refusing here, in the
    training process, says so at once rather than after each worker has imported torch."""
    import multiprocessing.context

    if multiprocessing.context.get_spawning_popen() is None:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "torch.utils.data.dataloader":
            return True
        frame = frame.f_back
    return False


def _agreed(args: Dict[str, Any]) -> Dict[str, Any]:
    """The settings every rank must share, as this rank will build its loader."""
    out = {k: args.get(k, _DEFAULTS[k]) for k in _AGREED}
    out["shuffle"] = str(_shuffle(args.get("shuffle")))
    out["remainder"] = args.get("remainder") or "drop"
    return out


def _first_difference(everyone: List[Dict[str, Any]], key: str) -> Optional[str]:
    """Names the first setting under ``key`` on which a rank differs from rank 0."""
    first = everyone[0][key]
    for r, other in enumerate(everyone[1:], start=1):
        for name, value in first.items():
            if other[key].get(name) != value:
                return (
                    f"ranks 0 and {r} differ on {name}: {value!r} and "
                    f"{other[key].get(name)!r}"
                )
    return None


def _check_ranks(everyone: List[Dict[str, Any]]) -> None:
    """Raises on every rank (they all see the same list) if the ranks' settings differ or
    no process reads some rank."""
    differs = _first_difference(everyone, "settings")
    if differs:
        raise ValueError(
            f"{differs}: every rank must pass the same settings (one seed for the whole job, "
            "not seed + rank: the plan already gives each rank its own samples), or ranks "
            "repeat and lose samples and take different numbers of steps"
        )
    world = everyone[0]["settings"]["world_size"]
    ranks = sorted({e["rank"] for e in everyone})
    if ranks != list(range(world)):
        unread = sorted(set(range(world)) - set(ranks))
        raise ValueError(
            f"the processes of this job read ranks {ranks} of world_size {world}, so ranks "
            f"{unread} are read by none and their samples are lost: leave rank= and "
            "world_size= to torch.distributed, or pass each process its own rank"
        )


def _check_datasets(everyone: List[Dict[str, Any]]) -> None:
    """Raises on every rank if another rank could not build its loader (so none waits for it
    at the first batch) or the ranks loaded different datasets."""
    for r, e in enumerate(everyone):
        if e["error"]:
            raise ValueError(
                f"rank {r} could not build its loader ({e['error']}); every rank stops here "
                "rather than wait for it"
            )
    first = everyone[0]
    for r, other in enumerate(everyone):
        if other["fingerprint"] != first["fingerprint"]:
            raise ValueError(
                f"ranks 0 and {r} loaded different datasets: rank 0 has {first['shards']} "
                f"shards, {first['samples']} samples (fingerprint {first['fingerprint']}), "
                f"rank {r} has {other['shards']} shards, {other['samples']} samples "
                f"(fingerprint {other['fingerprint']}); every rank must load the same "
                "manifest, or samples are repeated and lost and the ranks take different "
                "numbers of steps"
            )


class Loader(IterableDataset):
    """A ``sluice.Loader`` whose batches are dicts (or tuples) of torch tensors.

    Each batch (of N samples, the last of an epoch maybe fewer) is a dict:

    - ``image``: uint8 tensor, N×3×H×W (``layout="nchw"``) or N×H×W×3 (``"nhwc"``); on the
      GPU with ``device="cuda:K"``. A clip pipeline (``clip T``) makes N×T×3×H×W (N×T×H×W×3):
      ``image.permute(0, 2, 1, 3, 4)`` is the N×3×T×H×W torchvision's video models take.
    - ``frames``: int64 tensor N×T (clips only), each frame's index in its source clip.
    - ``label``: int64 tensor of N (every label -1 with ``label=None``, unlabeled data).
    - ``__key__``: list of N sample keys (the tar members' names, less the extension).
    - ``padding``: bool tensor of N, True for a repeated sample (``remainder="pad"``): leave
      those rows out of an evaluation's metric.
    - ``geometry``: each sample's crop box and flip, to map boxes into the tensor's pixels
      (``sluice.transform_boxes``).
    - ``__source__``: int64 tensor of N, each sample's source (a mixture's only; its index in
      ``loader.sources``).
    - each field asked for with ``fields=``: a list of N values, decoded by extension
      (``"field:<name>"`` for a field named like one of the keys above).

    Iterate it directly or as ``DataLoader(loader, batch_size=None)``; a DataLoader with a
    batch size or with workers is refused, naming this.

    Args:
        dataset: a manifest (``str`` or ``Path``), a served manifest's URL or shards.
        layout: ``"nchw"`` (default: the workers write channels first, so the tensor is
            contiguous N×C×H×W and DDP warns about no strides) or ``"nhwc"``.
        copy: clone ``image`` and ``label`` so a batch may outlive the loader's ring.
        to_tuple: keys of the batch dict to yield as a tuple instead,
            e.g. ``("image", "label")``.
        **kwargs: every argument of ``sluice.Loader`` (workers, batch_size, seed, pipeline,
            fields, label, remainder, device, ...). ``rank``/``world_size`` default to
            ``torch.distributed``'s when it is initialized, and in-process ``threads`` to this
            machine's cores shared by the job's ranks on it.
    """

    #: What frameworks read off a DataLoader (Lightning's every loop asks whether its loader
    #: shuffles through these): the batches are made by the plan, not by a batch sampler, and
    #: ``sampler`` only carries ``set_epoch``.
    batch_sampler: None = None

    def __init__(
        self,
        dataset: Any,
        *,
        layout: str = "nchw",
        copy: bool = False,
        to_tuple: Optional[Sequence[str]] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if layout not in ("nchw", "nhwc"):
            raise ValueError(f'layout: expected "nchw" or "nhwc", got {layout!r}')
        fields = kwargs.get("fields")
        named = [fields] if isinstance(fields, str) else list(fields or [])
        taken = [f for f in named if f in RESERVED_KEYS]
        if taken:
            raise ValueError(
                f"fields: {taken[0]!r} is one of the batch's own keys {RESERVED_KEYS}; a "
                f"sample field of that name comes with fields=\"all\" as "
                f"batch[\"field:{taken[0]}\"]"
            )
        self._copy = copy
        self._to_tuple = tuple(to_tuple) if to_tuple else None
        self._epoch = 0
        self.batch_size: int = kwargs.get("batch_size", 256)
        self.sampler = _EpochSetter(self)
        self._explicit = {
            k for k in ("rank", "world_size", "threads") if kwargs.get(k) is not None
        }
        self._args: Dict[str, Any] = dict(
            dataset=dataset, layout=layout, copy=copy, to_tuple=to_tuple, **kwargs
        )
        self._inner: Optional[_Loader] = None
        # Ranks compare their settings once per loader built here; never from a copy.
        self._checked = False
        self._collective = True
        self._build(_distributed())
        if self._to_tuple:
            self._check_to_tuple(kwargs.get("pipeline", DEFAULT_PIPELINE), fields)

    def _check_to_tuple(self, pipeline: str, fields: Any) -> None:
        """``to_tuple``'s keys against the keys this loader's batches will have: a wrong one
        is a ValueError now, not a KeyError at the first batch."""
        keys = ["image", "label", "__key__", "padding", "geometry"]
        if "clip" in _stages(pipeline):
            keys.append("frames")
        if self._inner is not None and self._inner.sources:
            keys.append("__source__")
        every_field = fields == "all" or (not isinstance(fields, str) and "all" in (fields or []))
        named = [fields] if isinstance(fields, str) else list(fields or [])
        keys += [f"field:{n}" if n in RESERVED_KEYS else n for n in named if n != "all"]
        for key in self._to_tuple or ():
            if not isinstance(key, str):
                raise ValueError(f"to_tuple: {key!r} is not a key (a str) of the batch dict")
            if key in keys or (every_field and key not in RESERVED_KEYS):
                continue
            hint = ""
            if key in ("frames", "__source__"):
                hint = (" (frames: only a clip pipeline's batches have it; __source__: only a "
                        "mixture's)")
            elif key not in RESERVED_KEYS:
                hint = f' (a sample field: ask for it with fields=["{key}"])'
            raise ValueError(f"to_tuple: {key!r} is not a key of this loader's batches, which "
                             f"are {keys}{hint}")

    # --- building ---------------------------------------------------------------------

    def _build(self, dist: Any) -> None:
        """Builds the inner loader unless one is there (of the right rank already), taking
        rank and world size from ``dist`` (when given and not explicit); with ``dist``, the
        ranks compare settings and datasets."""
        args = dict(self._args)
        # Under a process group only explicit arguments win over it; without one, what the
        # arguments hold (a copy's are the original's rank and world).
        given = {k: args.get(k) if dist is None or k in self._explicit else None
                 for k in ("rank", "world_size")}
        args["rank"], args["world_size"] = _env.rank_and_world(
            given["rank"], given["world_size"], dist)
        local = os.environ.get("LOCAL_WORLD_SIZE")
        everyone = None
        if dist is not None:
            everyone = self._gather(
                dist, {"host": socket.gethostname(), "rank": args["rank"],
                       "settings": _agreed(args)}
            )
            _check_ranks(everyone)
            if not local:
                local = sum(1 for e in everyone if e["host"] == socket.gethostname())
        if args.get("workers") is None and args.get("threads") is None and local:
            args["threads"] = _env.threads_per_rank(int(local))
        error: Optional[BaseException] = None
        made = self._inner is None
        if made:
            try:
                self._inner = self._make(args)
            except Exception as e:  # every rank hears of it below, then this one raises it
                error = e
        if dist is not None:
            mine: Dict[str, Any] = {
                "error": None if error is None else f"{type(error).__name__}: {error}"
            }
            if self._inner is not None:
                mine.update(self._inner.dataset_identity)
            everyone = self._gather(dist, mine)
            self._checked = True
            if error is None:
                _check_datasets(everyone)
        if error is not None:
            raise error
        # A copy is built from these (the same rank, world and threads), never from dist.
        if made:
            self._args.update(rank=args["rank"], world_size=args["world_size"])
            if "threads" in args:
                self._args["threads"] = args["threads"]

    @staticmethod
    def _gather(dist: Any, mine: Dict[str, Any]) -> List[Dict[str, Any]]:
        everyone: List[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        return everyone

    @staticmethod
    def _make(args: Dict[str, Any]) -> _Loader:
        args = dict(args)
        dataset = args.pop("dataset")
        layout = args.pop("layout")
        for key in ("copy", "to_tuple"):
            args.pop(key)
        pipeline = args.pop("pipeline", DEFAULT_PIPELINE)
        # `chw` is the last stage, but for a `random_erasing` that may follow it.
        has_chw = "chw" in _stages(pipeline)
        if layout == "nchw" and not has_chw:
            pipeline = f"{pipeline} | chw"
        elif layout == "nhwc" and has_chw:
            raise ValueError('layout="nhwc" with a pipeline that has chw')
        return _Loader(dataset=dataset, pipeline=pipeline, **args)

    def _loader(self) -> _Loader:
        """The inner loader, built now if this is a copy, and rebuilt for torch.distributed's
        rank when it was built before the process group with another one (a loader made at
        the top of a Lightning script, whose launcher sets no ``RANK``)."""
        if self._inner is None:
            self._build(None)
        elif self._collective and not self._checked:
            dist = _distributed()
            if dist is not None:
                identity = self._inner.dataset_identity
                wanted = (
                    self._args["rank"] if "rank" in self._explicit else dist.get_rank(),
                    self._args["world_size"] if "world_size" in self._explicit
                    else dist.get_world_size(),
                )
                if (identity["rank"], identity["world_size"]) != wanted:
                    _log.info("sluice.torch: rank %d of %d from torch.distributed (the loader "
                              "was built with rank %d of %d)", *wanted, identity["rank"],
                              identity["world_size"])
                    self._inner = None
                    if "threads" not in self._explicit:
                        self._args.pop("threads", None)
                # Rebuilt for the right rank, or kept: the ranks compare settings either way.
                self._build(dist)
        assert self._inner is not None
        return self._inner

    # --- epochs -------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter()`` reads (its order and augmentation)."""
        self._epoch = int(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` reads."""
        return self._epoch

    def __len__(self) -> int:
        """Batches per epoch, the same on every rank. For an epoch resumed at another world
        size: those handed out before the checkpoint plus this rank's share of the rest, so a
        loop that restored its step count (Lightning's) runs to the epoch's end."""
        _refuse_rebatching("measured")
        inner = self._loader()
        inner.set_epoch(self._epoch)
        n = len(inner)
        self._len_seen = (self._epoch, n)
        return n

    def __iter__(self) -> Iterator[Union[Dict[str, Any], Tuple[Any, ...]]]:
        _refuse_dataloader_worker()
        _refuse_rebatching("iterated")
        return self._batches(self._loader())

    def _batches(self, inner: _Loader) -> Iterator[Any]:
        # The epoch is the one set when the first batch is asked for, not at iter(): Lightning
        # resuming a checkpoint calls iter() before it sets the epoch it resumes.
        epoch = self._epoch
        mixed = bool(inner.sources)
        for images, labels in inner.epoch(epoch):
            yield self._batch(images, labels, mixed)
        # Finished: the next iter() is the next epoch, unless set_epoch said otherwise.
        if self._epoch == epoch:
            self._epoch = epoch + 1

    def _batch(self, images: Any, labels: Any,
               mixed: bool = False) -> Union[Dict[str, Any], Tuple[Any, ...]]:
        x = torch.from_dlpack(images)
        y = torch.from_dlpack(labels)
        if self._copy:
            x, y = x.clone(), y.clone()
        batch: Dict[str, Any] = {
            "image": x,
            "label": y,
            "__key__": images.keys,
            "padding": torch.tensor(images.padding, dtype=torch.bool),
            "geometry": images.geometry,
        }
        frames = images.frames
        if frames is not None:
            # A batch of clips: each row's source frame indices, N×T.
            batch["frames"] = torch.tensor(frames, dtype=torch.int64)
        if mixed:
            # A mixture's source of each sample (its place in ``loader.sources``).
            batch["__source__"] = torch.tensor(images.source, dtype=torch.int64)
        fields = images.fields
        for name in fields:
            key = f"field:{name}" if name in RESERVED_KEYS else name
            batch[key] = fields.column(name)
        if self._to_tuple:
            return tuple(batch[k] for k in self._to_tuple)
        return batch

    # --- checkpoints --------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The batches handed out so far (StatefulDataLoader's name for it). Any one rank's
        state resumes every rank (plan order)."""
        return {"epoch": self._epoch, "sluice": self._loader().state_dict()}

    def load_state_dict(self, state: Union[Dict[str, Any], Sequence[Dict[str, Any]]]) -> None:
        """Resumes from ``state_dict()``: this rank's, any other rank's of the same job (what
        Lightning and Accelerate checkpoints hold: rank 0's), or a list of every rank's
        states. At another world size the rest of the epoch is split across the new ranks.
        The next ``iter()`` delivers exactly the rest of that epoch. Under torch.distributed
        the ranks compare the epoch and resume point they loaded (a collective call)."""
        states = list(state) if isinstance(state, (list, tuple)) else [state]
        inner = [s.get("sluice", s) for s in states]
        epochs = {s["epoch"] for s in states if "epoch" in s}
        if len(epochs) > 1:
            raise ValueError(f"load_state_dict: the states are of different epochs {epochs}")
        loader = self._loader()
        loader.load_state_dict(inner if len(inner) > 1 else inner[0])
        outer = int(epochs.pop()) if epochs else None
        if any(inner):
            # The state's epoch, or the next one for a state taken once its epoch had handed
            # out every batch (Lightning's epoch-end checkpoints: it counts an epoch's batches
            # and never asks for the one after the last), or a later one this loader had been
            # set to (an epoch left early, then set_epoch).
            self._epoch = max(loader.next_epoch, outer if outer is not None else 0)
        elif outer is not None:
            self._epoch = outer
        self._warn_if_counted_short(loader)
        dist = _distributed() if self._collective else None
        if dist is not None:
            at = [(s.get("epoch"), s.get("batches"), s.get("world_size")) for s in inner if s]
            mine = {"resume": {"epoch": self._epoch, "from": at[0] if at else None}}
            differs = _first_difference(self._gather(dist, mine), "resume")
            if differs:
                raise ValueError(
                    f"load_state_dict: {differs} (epoch, then the checkpoint's epoch, batches "
                    "and world size): every rank must load the same job's state at the same "
                    "point"
                )

    def _warn_if_counted_short(self, loader: _Loader) -> None:
        """An epoch resumed at a larger world size has more batches, as a loop counts them
        (those before the checkpoint plus this rank's share of the rest), than ``len()``
        said before the state was loaded. A loop that fixed its length then stops early and
        leaves samples of the epoch unread: Lightning does (its ``limit_train_batches`` is
        taken from ``len()`` before it loads the loader's state)."""
        seen = getattr(self, "_len_seen", None)
        if seen is None or seen[0] != self._epoch:
            return
        loader.set_epoch(self._epoch)
        now = len(loader)
        if now > seen[1]:
            warnings.warn(
                f"this epoch, resumed at world_size {loader.dataset_identity['world_size']}, "
                f"has {now} batches as the loop counts them, but len() said {seen[1]} before "
                "the state was loaded: a loop that fixed its length then (Lightning does) "
                f"stops {now - seen[1]} batches early and leaves samples of this epoch unread. "
                "Under Lightning, resume a mid-epoch checkpoint at the world size it was "
                "taken at (or at a smaller one), or from an end-of-epoch checkpoint",
                stacklevel=3,
            )

    # --- copies -------------------------------------------------------------------------

    def __getstate__(self) -> Dict[str, Any]:
        if _sent_to_dataloader_workers():
            raise _in_dataloader_workers("sent to DataLoader worker processes")
        return {"args": self._args, "explicit": sorted(self._explicit), "epoch": self._epoch}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        """A copy: built from the original's arguments (its rank and world) on first use, in
        the process that uses it; it never takes part in the ranks' collective checks."""
        IterableDataset.__init__(self)
        self._args = dict(state["args"])
        self._explicit = set(state.get("explicit", ()))
        self._epoch = state["epoch"]
        self._copy = self._args["copy"]
        to_tuple = self._args["to_tuple"]
        self._to_tuple = tuple(to_tuple) if to_tuple else None
        self.batch_size = self._args.get("batch_size", 256)
        self.sampler = _EpochSetter(self)
        self._inner = None
        self._checked = True
        self._collective = False

    def __repr__(self) -> str:
        return f"<sluice.torch.Loader {self._args['dataset']!s} epoch {self._epoch}>"
