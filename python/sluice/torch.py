"""Sluice batches as PyTorch tensors, in the dialects PyTorch code already speaks.

::

    from sluice.torch import Loader

    loader = Loader("shards/manifest.json", batch_size=256, fields=["txt"])
    for epoch in range(epochs):             # each iter() is the next epoch, as DataLoader
        for batch in loader:
            x = batch["image"]              # N×3×H×W uint8, contiguous (layout="nchw")
            y = batch["label"]              # int64
            captions = batch["txt"]         # one str per row

How it differs from ``torch.utils.data.DataLoader``:

- Iterating again after a finished epoch starts the next one (DataLoader reshuffles on every
  ``iter()``; so does this). ``loader.set_epoch(e)`` or ``loader.sampler.set_epoch(e)``
  (what Lightning and Accelerate call) choose the epoch the next ``iter()`` reads.
- A batch is a dict ``{"image", "label", "__key__", "padding", "geometry", <each requested
  field>}``, or a tuple of those keys with ``to_tuple=("image", "label")``.
- With ``copy=False`` (the default) ``image`` and ``label`` are views of the loader's own
  buffers, which return to it once every tensor made from a batch is gone: keep at most
  ``ring_batches - 1`` batches alive. ``copy=True`` clones them, so batches may be kept (an
  evaluation loop collecting predictions).
- ``state_dict()``/``load_state_dict()`` are StatefulDataLoader's: the batches handed out so
  far; resuming delivers exactly the rest, also at another world size.
- Pickling (``copy.deepcopy``, a framework that copies dataloaders) rebuilds the loader from
  its arguments; the copy starts at the same epoch with nothing read.
- When ``torch.distributed`` is initialized, the ranks compare their datasets at
  construction (a collective call: every rank builds its loader at the same point): ranks
  that loaded different manifests would repeat and lose samples and take different numbers
  of steps, so they all raise ``ValueError`` naming what differs instead.

Every other argument is ``sluice.Loader``'s (see ``help(sluice.Loader)``).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional, Sequence, Tuple, Union

import torch
from torch.utils.data import IterableDataset

from . import Loader as _Loader

__all__ = ["Loader"]

_DEFAULT_PIPELINE = "decode | random_resized_crop 224 | hflip 0.5"


class _EpochSetter:
    """Stands where a DataLoader's sampler is: Lightning and Accelerate call
    ``loader.sampler.set_epoch(epoch)`` before each epoch."""

    def __init__(self, loader: "Loader") -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)


def _check_ranks_agree(mine: Dict[str, Any]) -> None:
    """Raises on every rank if the ranks of this torch.distributed job see different datasets
    or a world Sluice was not told about."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return
    world = dist.get_world_size()
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    if mine["world_size"] != world or mine["rank"] != dist.get_rank():
        raise ValueError(
            f"this loader plans rank {mine['rank']} of {mine['world_size']}, but "
            f"torch.distributed says rank {dist.get_rank()} of {world}: pass rank= and "
            "world_size= (or leave them to RANK and WORLD_SIZE)"
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

    Args:
        dataset: a manifest (``str`` or ``Path``).
        layout: ``"nchw"`` (default: the workers write channels first, so the tensor is
            contiguous N×C×H×W and DDP warns about no strides) or ``"nhwc"``.
        copy: clone ``image`` and ``label`` so a batch may outlive the loader's ring.
        to_tuple: keys of the batch dict to yield as a tuple instead,
            e.g. ``("image", "label")``.
        **kwargs: every argument of ``sluice.Loader`` (workers, batch_size, seed, pipeline,
            fields, label, remainder, device, ...).
    """

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
        self._args: Dict[str, Any] = dict(
            dataset=dataset, layout=layout, copy=copy, to_tuple=to_tuple, **kwargs
        )
        pipeline = kwargs.pop("pipeline", _DEFAULT_PIPELINE)
        ends_chw = pipeline.replace(" ", "").endswith("|chw")
        if layout == "nchw" and not ends_chw:
            pipeline = f"{pipeline} | chw"
        elif layout == "nhwc" and ends_chw:
            raise ValueError('layout="nhwc" with a pipeline that ends in chw')
        self._inner = _Loader(dataset=dataset, pipeline=pipeline, **kwargs)
        self._copy = copy
        self._to_tuple = tuple(to_tuple) if to_tuple else None
        self._epoch = 0
        self.batch_size: int = kwargs.get("batch_size", 256)
        self.sampler = _EpochSetter(self)
        _check_ranks_agree(self._inner.dataset_identity)

    # --- epochs -------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter()`` reads (its order and augmentation)."""
        self._epoch = int(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` reads."""
        return self._epoch

    def __len__(self) -> int:
        """Batches per epoch, the same on every rank."""
        return len(self._inner)

    def __iter__(self) -> Iterator[Union[Dict[str, Any], Tuple[Any, ...]]]:
        epoch = self._epoch
        for images, labels in self._inner.epoch(epoch):
            yield self._batch(images, labels)
        # Finished: the next iter() is the next epoch, unless set_epoch said otherwise.
        if self._epoch == epoch:
            self._epoch = epoch + 1

    def _batch(self, images: Any, labels: Any) -> Union[Dict[str, Any], Tuple[Any, ...]]:
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
        fields = images.fields
        for name in fields:
            batch[name] = fields[name]
        if self._to_tuple:
            return tuple(batch[k] for k in self._to_tuple)
        return batch

    # --- checkpoints --------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The batches handed out so far (StatefulDataLoader's name for it)."""
        return {"epoch": self._epoch, "sluice": self._inner.state_dict()}

    def load_state_dict(self, state: Union[Dict[str, Any], Sequence[Dict[str, Any]]]) -> None:
        """Resumes from ``state_dict()``; a list of every rank's states resumes at another
        world size. The next ``iter()`` delivers exactly the rest of that epoch."""
        states = list(state) if isinstance(state, (list, tuple)) else [state]
        inner = [s.get("sluice", s) for s in states]
        epochs = {s["epoch"] for s in states if "epoch" in s}
        if len(epochs) > 1:
            raise ValueError(f"load_state_dict: the states are of different epochs {epochs}")
        self._inner.load_state_dict(inner if len(inner) > 1 else inner[0])
        taken = [s.get("epoch") for s in inner if s]
        if taken:
            self._epoch = int(taken[0])
        elif epochs:
            self._epoch = int(epochs.pop())

    # --- copies -------------------------------------------------------------------------

    def __getstate__(self) -> Dict[str, Any]:
        return {"args": self._args, "epoch": self._epoch}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        args = dict(state["args"])
        dataset = args.pop("dataset")
        self.__init__(dataset, **args)
        self._epoch = state["epoch"]

    def __repr__(self) -> str:
        return f"<sluice.torch.Loader {self._args['dataset']!s} epoch {self._epoch}>"
