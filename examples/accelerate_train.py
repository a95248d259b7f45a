"""Hugging Face Accelerate on Sluice batches, checkpointed with save_state and resumed with
load_state, on any number of processes.

    accelerate launch --num_processes 2 examples/accelerate_train.py \\
        --dataset shards/manifest.json --save-at 3 --stop-after 5   # preempted after 5 steps
    accelerate launch --num_processes 3 examples/accelerate_train.py \\
        --dataset shards/manifest.json --resume                     # exactly the rest

(or torchrun --nproc_per_node N examples/accelerate_train.py ...). The loader needs no rank
arguments: Accelerator() starts the process group, and the loader takes rank and world size
from it. register_for_checkpointing(loader) puts its state_dict() in save_state's folder,
written by rank 0 alone; load_state gives that one state to every rank, which resumes each at
its own place, or splits the rest across a different number of ranks. --keys-out DIR writes
the keys each rank trained on (what the tests check, exactly once).
"""

import argparse
import json
import os

import torch
from accelerate import Accelerator

from sluice.torch import Loader

PIPELINE = "decode | random_resized_crop 64 | hflip 0.5"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", required=True)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--size", type=int, default=64, help="the crop's side, in pixels")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--seed", type=int, default=9)
    p.add_argument("--state-dir", default="accelerate_state")
    p.add_argument("--save-at", type=int, default=0, help="save_state after N steps")
    p.add_argument("--stop-after", type=int, default=0, help="stop after N steps")
    p.add_argument("--resume", action="store_true", help="load_state from --state-dir")
    p.add_argument("--keys-out", help="a folder for the keys each rank trained on")
    a = p.parse_args()

    # A GPU for each process on this host, else the CPU (gloo): two ranks on one GPU would
    # share it, which NCCL refuses ("Duplicate GPU detected").
    per_host = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    accelerator = Accelerator(cpu=torch.cuda.device_count() < per_host)
    loader = Loader(a.dataset, batch_size=a.batch_size, seed=a.seed,
                    pipeline=PIPELINE.replace("64", str(a.size)))
    model = torch.nn.Linear(3 * a.size * a.size, a.classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(loader)
    if a.resume:
        accelerator.load_state(a.state_dir)

    keys = []
    for step, batch in enumerate(loader):
        keys.append(list(batch["__key__"]))
        x = batch["image"].to(accelerator.device).float().flatten(1) / 255
        loss = torch.nn.functional.cross_entropy(model(x), batch["label"].to(accelerator.device))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if a.save_at and step + 1 == a.save_at:
            accelerator.save_state(a.state_dir)
        if a.stop_after and step + 1 == a.stop_after:
            break  # preempted
    if a.keys_out:
        os.makedirs(a.keys_out, exist_ok=True)
        with open(os.path.join(a.keys_out, f"rank{accelerator.process_index}.json"), "w") as f:
            json.dump(keys, f)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
