"""A DDP training job on Sluice batches under torchrun, with a checkpoint, a resume and an
evaluation loop that scores every held-back sample exactly once.

    torchrun --nproc_per_node 2 examples/ddp_train.py --dataset shards/manifest.json \\
        [--eval-dataset held-back/manifest.json] [--workers cpu-0:7100,cpu-1:7100 \\
         --token-file token --trust-cert cert.pem] [--stop-after 5]

Without --workers each rank decodes in its own process (its share of the machine's cores).
--stop-after N saves a checkpoint after N steps of the first epoch and exits, as a job that is
preempted; run the same command again (any --nproc_per_node) and it resumes exactly there.
Uses NCCL and the GPU when there is one, else gloo on the CPU.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from sluice.torch import Loader

PIPELINE = "decode | random_resized_crop 64 | hflip 0.5"
EVAL_PIPELINE = "decode | resize 72 | center_crop 64"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", required=True)
    p.add_argument("--eval-dataset")
    p.add_argument("--workers")
    p.add_argument("--token-file")
    p.add_argument("--trust-cert")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--checkpoint", default="ddp_train.ckpt")
    p.add_argument("--stop-after", type=int, default=0)
    a = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    remote = {}
    if a.workers:
        remote = dict(workers=a.workers.split(","), token_file=a.token_file,
                      trust_cert=a.trust_cert)

    # rank and world_size come from torch.distributed; the ranks check that they all loaded
    # the same dataset with the same settings before the first batch.
    loader = Loader(a.dataset, batch_size=a.batch_size, pipeline=PIPELINE, seed=0,
                    epochs=a.epochs, **remote)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, stride=2), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, stride=2), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, a.classes),
    ).to(device)
    model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    if os.path.exists(a.checkpoint):
        state = torch.load(a.checkpoint, weights_only=False)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        # Rank 0's loader state resumes every rank: each at its own place at the same world
        # size, or with the rest of the epoch split across this job's ranks at another.
        loader.load_state_dict(state["loader"])
        if rank == 0:
            print(f"resumed epoch {loader.epoch} from {a.checkpoint}, {len(loader)} batches "
                  f"an epoch on {world} ranks")

    for epoch in range(loader.epoch, a.epochs):
        model.train()
        for step, batch in enumerate(loader):
            x = batch["image"].to(device, non_blocking=True).float().div_(255)
            y = batch["label"].to(device, non_blocking=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if a.stop_after and epoch == 0 and step + 1 == a.stop_after:
                if rank == 0:
                    torch.save({"model": model.module.state_dict(),
                                "optimizer": opt.state_dict(), "loader": loader.state_dict()},
                               a.checkpoint)
                    print(f"stopped after {step + 1} steps of epoch 0; saved {a.checkpoint}")
                dist.barrier()
                dist.destroy_process_group()
                return
        if rank == 0:
            print(f"epoch {epoch}: last loss {loss.item():.3f}")

    if a.eval_dataset:
        # shuffle="none": the manifest in order, one contiguous run per rank, the same every
        # time; remainder="pad": every rank takes the same number of batches and every sample
        # is scored once; the repeats that even out the ranks are marked padding.
        held_back = Loader(a.eval_dataset, batch_size=a.batch_size, pipeline=EVAL_PIPELINE,
                           shuffle="none", remainder="pad", epochs=1, **remote)
        model.eval()
        correct = torch.zeros(2, device=device)
        with torch.no_grad():
            for batch in held_back:
                keep = ~batch["padding"].to(device)
                x = batch["image"].to(device).float().div_(255)
                hit = model(x).argmax(1) == batch["label"].to(device)
                correct += torch.stack([(hit & keep).sum(), keep.sum()]).float()
        dist.all_reduce(correct)
        if rank == 0:
            print(f"eval: {int(correct[1])} samples scored, accuracy "
                  f"{(correct[0] / correct[1]).item():.3f}")
    if os.path.exists(a.checkpoint) and rank == 0:
        os.remove(a.checkpoint)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
