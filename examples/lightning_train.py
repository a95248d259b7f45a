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
"""

import argparse
import json
import os

import lightning as L
import torch

from sluice.torch import Loader

PIPELINE = "decode | random_resized_crop 64 | hflip 0.5"


class Data(L.LightningDataModule):
    def __init__(self, dataset, batch_size, pipeline, seed):
        super().__init__()
        self.args = dict(dataset=dataset, batch_size=batch_size, pipeline=pipeline, seed=seed)

    def train_dataloader(self):
        # After the process group: rank and world size come from torch.distributed.
        args = dict(self.args)
        return Loader(args.pop("dataset"), **args)


class Model(L.LightningModule):
    def __init__(self, size, classes, stop_after=0):
        super().__init__()
        self.net = torch.nn.Linear(3 * size * size, classes)
        self.stop_after = stop_after
        self.keys = []

    def training_step(self, batch, _):
        self.keys.append([self.trainer.current_epoch, list(batch["__key__"])])
        if self.stop_after and self.trainer.global_step + 1 >= self.stop_after:
            self.trainer.should_stop = True  # preempted
        x = batch["image"].float().flatten(1) / 255
        return torch.nn.functional.cross_entropy(self.net(x), batch["label"])

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
    p.add_argument("--resume", help="a checkpoint to resume from")
    p.add_argument("--keys-out", help="a folder for the keys each rank trained on")
    a = p.parse_args()

    pipeline = a.pipeline or PIPELINE.replace("64", str(a.size))
    callbacks = []
    if a.every_n_steps:
        callbacks.append(L.pytorch.callbacks.ModelCheckpoint(
            dirpath=a.checkpoint_dir, every_n_train_steps=a.every_n_steps, save_top_k=-1,
            filename="{step}"))
    trainer = L.Trainer(accelerator=a.accelerator, strategy="ddp", devices=a.devices,
                        max_epochs=a.epochs, callbacks=callbacks, logger=False,
                        enable_checkpointing=bool(callbacks), enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=a.checkpoint_dir)
    model = Model(a.size, a.classes, a.stop_after)
    trainer.fit(model, datamodule=Data(a.dataset, a.batch_size, pipeline, a.seed),
                ckpt_path=a.resume)
    if a.keys_out:
        os.makedirs(a.keys_out, exist_ok=True)
        with open(os.path.join(a.keys_out, f"rank{trainer.global_rank}.json"), "w") as f:
            json.dump(model.keys, f)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
