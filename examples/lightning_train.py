"""Lightning DDP on Sluice batches, checkpointed and resumed by Lightning alone.

    python examples/lightning_train.py --dataset shards/manifest.json --devices 2 \\
        --every-n-steps 3 --stop-after 5        # a job preempted after 5 steps
    python examples/lightning_train.py --dataset shards/manifest.json --devices 2 \\
        --resume lightning_ckpt/step=3.ckpt     # goes on with exactly the rest of the epoch

Lightning's own launcher starts the other ranks (no torchrun, no rank arguments): the loader,
built in the DataModule's train_dataloader(), takes rank and world size from
torch.distributed. ModelCheckpoint stores rank 0's loader state, which resumes every rank at
its own place. On the CPU (gloo) unless --accelerator gpu. --keys-out DIR writes the keys each
rank trained on (what the tests check, exactly once).

With --eval-dataset the same job validates in fit() and, with --after-fit, runs Lightning's
other loops: `validate`, `test` and `predict`, each on a loader with shuffle="none" and
remainder="pad" (every rank the same number of batches; a repeated sample is marked in
batch["padding"] and left out of the metric). --epoch-checkpoints keeps Lightning's default
checkpoint, saved at each epoch's end: resumed, the next epoch runs in the order an
uninterrupted job would have.
"""

import argparse
import json
import os

import lightning as L
import torch

from sluice.torch import Loader

PIPELINE = "decode | random_resized_crop 64 | hflip 0.5"


class Data(L.LightningDataModule):
    def __init__(self, dataset, batch_size, pipeline, seed, eval_dataset=None):
        super().__init__()
        self.args = dict(dataset=dataset, batch_size=batch_size, pipeline=pipeline, seed=seed)
        self.eval_dataset = eval_dataset

    def train_dataloader(self):
        # After the process group: rank and world size come from torch.distributed.
        args = dict(self.args)
        return Loader(args.pop("dataset"), **args)

    def _eval(self):
        # The same samples every time, every rank the same number of batches: shuffle="none"
        # reads each rank's share in manifest order, remainder="pad" repeats a sample where
        # the ranks' shares differ, marked in batch["padding"].
        return Loader(self.eval_dataset, batch_size=self.args["batch_size"],
                      pipeline=self.args["pipeline"], shuffle="none", remainder="pad")

    def val_dataloader(self):
        return self._eval()

    def test_dataloader(self):
        return self._eval()

    def predict_dataloader(self):
        return self._eval()


class Model(L.LightningModule):
    def __init__(self, size, classes, stop_after=0):
        super().__init__()
        self.net = torch.nn.Linear(3 * size * size, classes)
        self.stop_after = stop_after
        self.keys = []
        # What each evaluation loop saw: [loop, epoch, keys, padding].
        self.evaluated = []

    def forward(self, batch):
        return self.net(batch["image"].float().flatten(1) / 255)

    def training_step(self, batch, _):
        self.keys.append([self.trainer.current_epoch, list(batch["__key__"])])
        if self.stop_after and self.trainer.global_step + 1 >= self.stop_after:
            self.trainer.should_stop = True  # preempted
        return torch.nn.functional.cross_entropy(self(batch), batch["label"])

    def _evaluate(self, loop, batch):
        if not self.trainer.sanity_checking:
            self.evaluated.append([loop, self.trainer.current_epoch, list(batch["__key__"]),
                                   batch["padding"].tolist()])
        real = ~batch["padding"]  # a repeated sample counts once, on the rank that owns it
        loss = torch.nn.functional.cross_entropy(self(batch)[real], batch["label"][real],
                                                 reduction="sum")
        self.log(f"{loop}_loss", loss / max(int(real.sum()), 1), sync_dist=True)

    def validation_step(self, batch, _):
        self._evaluate("validate", batch)

    def test_step(self, batch, _):
        self._evaluate("test", batch)

    def predict_step(self, batch, _):
        self.evaluated.append(["predict", self.trainer.current_epoch, list(batch["__key__"]),
                               batch["padding"].tolist()])
        return self(batch).argmax(1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", required=True)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--size", type=int, default=64, help="the crop's side, in pixels")
    p.add_argument("--pipeline", help=f"default: {PIPELINE!r} with --size")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--checkpoint-dir", default="lightning_ckpt")
    p.add_argument("--every-n-steps", type=int, default=0, help="checkpoint every N steps")
    p.add_argument("--stop-after", type=int, default=0, help="stop after N steps")
    p.add_argument("--epoch-checkpoints", action="store_true",
                   help="Lightning's default checkpoint at each epoch's end, every one kept")
    p.add_argument("--resume", help="a checkpoint to resume from")
    p.add_argument("--eval-dataset", help="a manifest to validate, test and predict on")
    p.add_argument("--after-fit", default="",
                   help="loops to run after fit, comma-separated: validate,test,predict")
    p.add_argument("--keys-out", help="a folder for the keys each rank trained on")
    a = p.parse_args()

    pipeline = a.pipeline or PIPELINE.replace("64", str(a.size))
    callbacks = []
    if a.every_n_steps:
        callbacks.append(L.pytorch.callbacks.ModelCheckpoint(
            dirpath=a.checkpoint_dir, every_n_train_steps=a.every_n_steps, save_top_k=-1,
            filename="{step}"))
    if a.epoch_checkpoints:
        callbacks.append(L.pytorch.callbacks.ModelCheckpoint(
            dirpath=a.checkpoint_dir, save_top_k=-1, filename="{epoch}"))
    trainer = L.Trainer(accelerator=a.accelerator, strategy="ddp", devices=a.devices,
                        max_epochs=a.epochs, callbacks=callbacks, logger=False,
                        # Without evaluation data Lightning runs no validation loop.
                        limit_val_batches=1.0 if a.eval_dataset else 0,
                        enable_checkpointing=bool(callbacks), enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=a.checkpoint_dir)
    model = Model(a.size, a.classes, a.stop_after)
    data = Data(a.dataset, a.batch_size, pipeline, a.seed, a.eval_dataset)
    trainer.fit(model, datamodule=data, ckpt_path=a.resume)
    for loop in filter(None, a.after_fit.split(",")):
        getattr(trainer, loop)(model, datamodule=data)
    if a.keys_out:
        os.makedirs(a.keys_out, exist_ok=True)
        with open(os.path.join(a.keys_out, f"rank{trainer.global_rank}.json"), "w") as f:
            json.dump(model.keys, f)
        with open(os.path.join(a.keys_out, f"rank{trainer.global_rank}-eval.json"), "w") as f:
            json.dump(model.evaluated, f)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
