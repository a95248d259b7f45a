"""A few training steps of a torchvision ResNet fed by Sluice, on CPU or on a GPU.

    python examples/train_resnet.py --dataset shards/manifest.json             # in-process decoding
    python examples/train_resnet.py --dataset manifest.json --workers cpu-0:7100 \
        --token-file token --trust-cert cert.pem                                # sluice cpu workers
    python examples/train_resnet.py --dataset shards/manifest.json --device cuda:0
        # device batches, normalized on the GPU (sluice installed with the cuda feature)

Make a dataset with `sluice synth` + `sluice shard --manifest`, or `sluice index` over your
shards. Under torchrun, RANK and WORLD_SIZE pick this process's share of every epoch.
"""

import argparse
import time

import torch
import torchvision

import sluice

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", required=True)
    p.add_argument("--workers", nargs="*", default=None, help="host:port of sluice cpu workers")
    p.add_argument("--token-file")
    p.add_argument("--trust-cert")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--size", type=int, default=112, help="crop size (224 for real training)")
    p.add_argument("--device", default="cpu", help="cpu or cuda:N")
    args = p.parse_args()
    on_gpu = args.device != "cpu"

    # Where a DataLoader would be:
    #   loader = DataLoader(ImageFolder(root, transform), batch_size=32, shuffle=True, num_workers=8)
    loader = sluice.Loader(
        dataset=args.dataset,
        workers=args.workers,  # None: decode in this process
        batch_size=args.batch_size,
        seed=0,
        shuffle="global",
        pipeline=f"decode | random_resized_crop {args.size} | hflip 0.5",
        token_file=args.token_file,
        trust_cert=args.trust_cert,
        # On a GPU, batches arrive on the device already normalized, N×3×H×W float32.
        device=args.device,
        **({"dtype": "float32"} if on_gpu else {}),
    )
    model = torchvision.models.resnet18(num_classes=args.classes).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()

    step, epoch, started = 0, 0, time.time()
    while step < args.steps:
        loader.set_epoch(epoch)
        for images, labels in loader:
            # Zero copy: torch wraps the loader's buffer (N×H×W×3 uint8). The buffer returns to
            # Sluice when `images` and every tensor viewing it are gone, so convert before
            # keeping anything across steps.
            if on_gpu:
                # The current stream waits for the batch's copy; no host synchronisation.
                x = torch.from_dlpack(images)
            else:
                x = torch.from_dlpack(images).permute(0, 3, 1, 2).float().div_(255)
                x = (x - MEAN) / STD
            y = torch.from_dlpack(labels)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            print(f"epoch {epoch} step {step}: loss {loss.item():.3f}, batch {tuple(x.shape)}")
            if step == args.steps:
                break
        epoch += 1
    # A checkpoint holds the loader's place in the epoch beside the model's weights.
    torch.save({"model": model.state_dict(), "loader": loader.state_dict()}, "/tmp/sluice-example.pt")
    print(f"{step} steps in {time.time() - started:.1f}s; checkpoint /tmp/sluice-example.pt")


if __name__ == "__main__":
    main()
