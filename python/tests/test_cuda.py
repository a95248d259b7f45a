"""device="cuda:N": batches on the GPU through DLPack, with no copy, in the consumer's stream
order. These run where sluice was built with the `cuda` feature, a GPU is present and torch
has CUDA; elsewhere they skip and say why. The first test runs everywhere."""

import numpy as np
import pytest

import sluice

PIPELINE = "decode | resize 40 | center_crop 32"
TOTAL = 90


def cuda_loader(dataset, **kwargs):
    """A loader on cuda:0, or a skip that says what is missing."""
    try:
        return sluice.Loader(dataset=dataset, pipeline=PIPELINE, device="cuda:0", **kwargs)
    except ValueError as e:
        if "without CUDA support" in str(e):
            pytest.skip(f"this sluice build has no CUDA: {e}")
        raise
    except sluice.SluiceError as e:
        pytest.skip(f"no usable GPU: {e}")


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return torch


def host_batches(dataset, batch_size=8):
    """id -> image (H×W×C uint8) and label from the CPU loader, for comparison."""
    loader = sluice.Loader(dataset=dataset, batch_size=batch_size, pipeline=PIPELINE, seed=5)
    out = {}
    for images, labels in loader.epoch(0):
        x, y = np.from_dlpack(images), np.from_dlpack(labels)
        for i, sid in enumerate(images.ids):
            out[sid] = (x[i].copy(), int(y[i]))
    return out


def test_without_cuda_the_error_says_how_to_get_it(dataset):
    try:
        loader = sluice.Loader(dataset=dataset, pipeline=PIPELINE, device="cuda:0")
    except ValueError as e:
        assert "without CUDA support" in str(e) and "--features cuda" in str(e)
    except sluice.SluiceError as e:
        # A CUDA build on a machine without a GPU says so.
        assert "cuda:0" in str(e)
    else:
        assert len(loader) > 0


def test_device_batches_are_zero_copy_and_exactly_once(dataset, torch):
    want = host_batches(dataset)
    loader = cuda_loader(dataset, batch_size=8, seed=5)
    seen = []
    for images, labels in loader.epoch(0):
        assert images.device == "cuda:0" and images.__dlpack_device__() == (2, 0)
        x = torch.from_dlpack(images)
        y = torch.from_dlpack(labels)
        assert x.is_cuda and x.dtype == torch.uint8 and x.shape == (len(images), 32, 32, 3)
        # torch wraps the loader's device buffer: the same address.
        assert x.data_ptr() == images.data_ptr and y.data_ptr() == labels.data_ptr
        xs, ys = x.cpu().numpy(), y.cpu().numpy()
        for i, sid in enumerate(images.ids):
            assert np.array_equal(xs[i], want[sid][0]), f"sample {sid} differs from the CPU batch"
            assert ys[i] == want[sid][1]
        seen.extend(images.ids)
    assert len(seen) == TOTAL and len(set(seen)) == TOTAL


def test_a_held_device_tensor_is_never_overwritten(dataset, torch):
    loader = cuda_loader(dataset, batch_size=8, seed=5)
    epoch = loader.epoch(0)
    images, _ = next(epoch)
    held = torch.from_dlpack(images)
    snapshot = held.clone()
    first = images.data_ptr
    del images
    later = []
    for images, _ in epoch:
        t = torch.from_dlpack(images)
        t.add_(1)  # work on the consumer's stream, queued before the tensor goes
        later.append(images.data_ptr)
        del t, images
    torch.cuda.synchronize()
    assert first not in later
    assert torch.equal(held, snapshot)


def test_the_consumers_stream_waits_for_the_copy(dataset, torch):
    want = host_batches(dataset)
    loader = cuda_loader(dataset, batch_size=8, seed=5)
    side = torch.cuda.Stream()
    total = 0
    with torch.cuda.stream(side):
        for images, _ in loader.epoch(0):
            # from_dlpack passes the current (side) stream; the sum is queued on it, after
            # the copy, with no host synchronisation in between.
            s = torch.from_dlpack(images).to(torch.int64).sum()
            expect = sum(int(want[sid][0].astype(np.int64).sum()) for sid in images.ids)
            total += 1
            assert int(s) == expect
    assert total == -(-TOTAL // 8)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_on_device_conversion_normalizes_into_nchw(dataset, torch, dtype):
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    want = host_batches(dataset)
    loader = cuda_loader(dataset, batch_size=8, seed=5, dtype=dtype, mean=mean, std=std)
    images, _ = next(iter(loader.epoch(0)))
    x = torch.from_dlpack(images)
    assert images.dtype == dtype and x.dtype == getattr(torch, dtype)
    assert x.shape == (len(images), 3, 32, 32)
    got = x.float().cpu().numpy()
    for i, sid in enumerate(images.ids):
        raw = want[sid][0].astype(np.float32) / 255.0  # H×W×C
        expect = ((raw - np.array(mean, np.float32)) / np.array(std, np.float32)).transpose(2, 0, 1)
        tol = 1e-5 if dtype == "float32" else 5e-3
        assert np.allclose(got[i], expect, atol=tol), f"sample {sid}"


def test_a_cpu_consumer_is_refused_a_device_batch(dataset, torch):
    loader = cuda_loader(dataset, batch_size=8)
    images, _ = next(iter(loader.epoch(0)))
    with pytest.raises(BufferError, match="does not copy between devices"):
        images.__dlpack__(dl_device=(1, 0))
    with pytest.raises(BufferError, match="ambiguous"):
        images.__dlpack__(stream=0)


def test_held_device_batches_do_not_stall_the_ring(dataset, torch):
    # Each ring buffer goes back once its copy has read it, so holding more device batches
    # than ring_batches is fine (they hold device memory only).
    loader = cuda_loader(dataset, batch_size=8, ring_batches=2)
    held = [torch.from_dlpack(images) for images, _ in loader.epoch(0)]
    assert len(held) == -(-TOTAL // 8)
    assert len({t.data_ptr() for t in held}) == len(held)
