"""Sluice loaders under 🤗 transformers' ``Trainer``: it trains, evaluates and resumes from its
own checkpoints, each sample once per epoch, at any number of ranks.

::

    from sluice.torch import Loader
    from sluice.transformers import Trainer

    trainer = Trainer(
        model=model, args=TrainingArguments("out", save_steps=100, ...),
        train_loader=Loader("train/manifest.json", batch_size=64, pipeline=...),
        eval_loader=Loader("val/manifest.json", batch_size=64, pipeline=...,
                           shuffle="none", remainder="pad"),
    )
    trainer.train()                              # or train(resume_from_checkpoint=True)

``Trainer`` here is ``transformers.Trainer`` with three changes, all through its documented
hooks:

- ``get_train_dataloader`` and ``get_eval_dataloader`` hand out the Sluice loaders as they are
  (Trainer would wrap a dataset in a DataLoader of its own, which would batch Sluice's batches
  again and shard them across ranks a second time). Each batch goes to the model as
  ``inputs(batch)``: by default ``{"pixel_values": image as float in [0, 1], "labels":
  label}``, with the labels of padded rows (an evaluation's repeats, ``remainder="pad"``) set
  to -100, which losses and metrics conventionally leave out.
- Every checkpoint Trainer saves also holds the training loader's ``state_dict()``
  (``sluice_loader.json``, rank 0's, which resumes every rank), and ``train(
  resume_from_checkpoint=...)`` loads it: the loader delivers exactly the rest of the epoch,
  or the next epoch for a checkpoint at an epoch's end.
- ``ignore_data_skip`` is set: the loader resumes itself, so Trainer does not read and drop
  the batches before the checkpoint (which a DataLoader needs, and which this loader would
  deliver only once).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Iterator, Optional

import transformers
from transformers.trainer_utils import get_last_checkpoint

from .torch import Loader

__all__ = ["Trainer", "image_classification_inputs", "STATE_FILE"]

#: The training loader's state in each of Trainer's checkpoint folders.
STATE_FILE = "sluice_loader.json"


def image_classification_inputs(batch: Dict[str, Any]) -> Dict[str, Any]:
    """A Sluice batch as an image classifier's keyword arguments: ``pixel_values`` (float,
    in [0, 1], N×C×H×W) and ``labels`` (-100 for a padded row)."""
    labels = batch["label"].clone()
    labels[batch["padding"]] = -100
    return {"pixel_values": batch["image"].float().div_(255), "labels": labels}


class _Inputs:
    """A Sluice loader whose batches come out as the model's keyword arguments; ``len`` and
    ``set_epoch`` are the loader's (what Trainer asks of a dataloader)."""

    def __init__(self, loader: Loader, inputs: Callable[[Dict[str, Any]], Dict[str, Any]]):
        self.loader = loader
        self.inputs = inputs

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for batch in self.loader:
            yield self.inputs(batch)


class _SaveLoaderState(transformers.TrainerCallback):
    """Writes the training loader's state into each checkpoint folder Trainer has just saved."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.is_world_process_zero:
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, STATE_FILE)
            with open(path + ".tmp", "w") as f:
                json.dump(self.loader.state_dict(), f)
            os.replace(path + ".tmp", path)
        return control


class Trainer(transformers.Trainer):
    """``transformers.Trainer`` reading Sluice loaders (see the module's documentation).

    Args:
        train_loader: the ``sluice.torch.Loader`` to train on.
        eval_loader: the one ``evaluate()`` reads (``shuffle="none", remainder="pad"``, so
            every rank takes the same number of steps and each sample counts once).
        inputs: a Sluice batch → the model's keyword arguments (default
            :func:`image_classification_inputs`).
        Every other argument is ``transformers.Trainer``'s (no ``train_dataset`` or
        ``eval_dataset``: the loaders replace them).
    """

    def __init__(
        self,
        *args: Any,
        train_loader: Optional[Loader] = None,
        eval_loader: Optional[Loader] = None,
        inputs: Callable[[Dict[str, Any]], Dict[str, Any]] = image_classification_inputs,
        **kwargs: Any,
    ) -> None:
        for given in ("train_dataset", "eval_dataset"):
            if kwargs.get(given) is not None:
                raise ValueError(
                    f"sluice.transformers.Trainer: {given}= is replaced by "
                    f"{given.replace('dataset', 'loader')}= (a sluice.torch.Loader)"
                )
        super().__init__(*args, **kwargs)
        self.train_loader = train_loader
        self.eval_loader = eval_loader
        self.inputs = inputs
        # The loader resumes itself; Trainer must not read and drop the batches before.
        self.args.ignore_data_skip = True
        self._loader_state: Optional[Dict[str, Any]] = None
        if train_loader is not None:
            self.add_callback(_SaveLoaderState(train_loader))

    def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        folder = resume_from_checkpoint
        if folder is True:
            folder = get_last_checkpoint(self.args.output_dir)
        if isinstance(folder, (str, os.PathLike)):
            path = os.path.join(folder, STATE_FILE)
            if not os.path.exists(path):
                raise ValueError(
                    f"{folder} holds no {STATE_FILE}: it was not saved by "
                    "sluice.transformers.Trainer, so the loader cannot resume where it was"
                )
            with open(path) as f:
                self._loader_state = json.load(f)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def get_train_dataloader(self) -> Any:
        if self.train_loader is None:
            raise ValueError("sluice.transformers.Trainer: train() needs train_loader=")
        if self._loader_state is not None:
            self.train_loader.load_state_dict(self._loader_state)
            self._loader_state = None
        return _Inputs(self.train_loader, self.inputs)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        if eval_dataset is not None:
            raise ValueError("sluice.transformers.Trainer: pass eval_loader=, not a dataset")
        if self.eval_loader is None:
            raise ValueError("sluice.transformers.Trainer: evaluate() needs eval_loader=")
        return _Inputs(self.eval_loader, self.inputs)
