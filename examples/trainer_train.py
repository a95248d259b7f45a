"""🤗 transformers' Trainer on Sluice batches: trains, checkpoints (the loader's state beside
Trainer's own), resumes, and evaluates, at any number of ranks.

    python -m torch.distributed.run --nproc_per_node 2 examples/trainer_train.py \\
        --dataset shards/manifest.json --eval-dataset shards/manifest.json \\
        --save-steps 3 --stop-after 5                      # a job preempted after 5 steps
    python -m torch.distributed.run --nproc_per_node 2 examples/trainer_train.py \\
        --dataset shards/manifest.json --eval-dataset shards/manifest.json --resume

The model is a linear classifier on the crop's pixels, so the recipe runs anywhere (CPU ranks
on gloo unless --cuda); any model whose forward takes pixel_values and labels takes its place.
--keys-out DIR writes the keys each rank trained and evaluated on (what the tests check).
"""

import argparse
import json
import os

import torch
import transformers

from sluice.torch import Loader
from sluice.transformers import Trainer, image_classification_inputs


class Classifier(torch.nn.Module):
    def __init__(self, size, classes):
        super().__init__()
        self.net = torch.nn.Linear(3 * size * size, classes)
        self.trained, self.evaluated = [], []

    def forward(self, pixel_values, labels=None, keys=None, padding=None):
        if keys is not None:
            if self.training:
                self.trained.append(list(keys))
            else:
                self.evaluated.append([list(keys), padding.tolist()])
        logits = self.net(pixel_values.flatten(1))
        loss = torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100)
        return {"loss": loss, "logits": logits}


class StopAfter(transformers.TrainerCallback):
    """Ends the job after `steps` optimizer steps, as a preemption would."""

    def __init__(self, steps):
        self.steps = steps

    def on_step_end(self, args, state, control, **kwargs):
        if self.steps and state.global_step >= self.steps:
            control.should_training_stop = True
        return control


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", required=True)
    p.add_argument("--eval-dataset")
    p.add_argument("--pipeline", default="decode | resize 40 | center_crop 32")
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--classes", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--output-dir", default="trainer_out")
    p.add_argument("--save-steps", type=int, default=0, help="a checkpoint every N steps")
    p.add_argument("--stop-after", type=int, default=0, help="stop after N steps")
    p.add_argument("--resume", action="store_true", help="from the last checkpoint")
    p.add_argument("--cuda", action="store_true")
    p.add_argument("--keys-out")
    a = p.parse_args()

    args = transformers.TrainingArguments(
        output_dir=a.output_dir, num_train_epochs=a.epochs, learning_rate=0.01,
        save_strategy="steps" if a.save_steps else "no", save_steps=a.save_steps or 500,
        logging_strategy="no", report_to=[], use_cpu=not a.cuda,
        ddp_backend=None if a.cuda else "gloo", seed=a.seed,
    )
    common = dict(batch_size=a.batch_size, pipeline=a.pipeline)
    train_loader = Loader(a.dataset, seed=a.seed, **common)
    eval_loader = (Loader(a.eval_dataset, shuffle="none", remainder="pad", **common)
                   if a.eval_dataset else None)

    def inputs(batch):
        # The classifier's arguments, and the keys the tests check exactly once.
        return {**image_classification_inputs(batch), "keys": batch["__key__"],
                "padding": batch["padding"]}

    model = Classifier(a.size, a.classes)
    trainer = Trainer(model=model, args=args, train_loader=train_loader,
                      eval_loader=eval_loader, inputs=inputs,
                      callbacks=[StopAfter(a.stop_after)])
    trainer.train(resume_from_checkpoint=True if a.resume else None)
    if eval_loader is not None and not a.stop_after:
        print(trainer.evaluate())
    if a.keys_out:
        os.makedirs(a.keys_out, exist_ok=True)
        with open(os.path.join(a.keys_out, f"rank{trainer.args.process_index}.json"), "w") as f:
            json.dump({"trained": model.trained, "evaluated": model.evaluated}, f)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
