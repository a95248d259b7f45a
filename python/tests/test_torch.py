"""sluice.torch as PyTorch code uses it: plain epoch loops and Lightning's Trainer advance the
epoch (checked from the keys: each epoch exactly once, in a new order), batches are tensors
in dicts, DataLoader(loader, batch_size=None) and copies work, an eval loop may keep its
batches, and checkpoints resume exactly the rest. Needs torch (and Lightning for its test);
CI's venv has neither, so these skip there with a message."""

import copy
import pickle

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (CI's venv has none)")
import sluice.torch as st  # noqa: E402

PIPELINE = "decode | resize 40 | center_crop 32"
TOTAL = 90


def keys_of_epoch(loader):
    keys = []
    for batch in loader:
        assert isinstance(batch["image"], torch.Tensor) and batch["image"].dtype == torch.uint8
        assert batch["image"].shape[1:] == (3, 32, 32) and batch["image"].is_contiguous()
        assert batch["label"].dtype == torch.int64 and len(batch["label"]) == len(batch["__key__"])
        keys.extend(batch["__key__"])
    return keys


def assert_epochs_advance(epochs):
    for e, keys in enumerate(epochs):
        assert len(keys) == TOTAL and len(set(keys)) == TOTAL, f"epoch {e} exactly once"
    orders = {tuple(k) for k in epochs}
    assert len(orders) == len(epochs), "every epoch in a new order"


def test_a_plain_loop_advances_the_epoch_on_every_iteration(dataset):
    loader = st.Loader(dataset, batch_size=8, pipeline=PIPELINE, seed=3)
    assert len(loader) == 12 and loader.batch_size == 8
    epochs = [keys_of_epoch(loader) for _ in range(3)]
    assert_epochs_advance(epochs)
    assert loader.epoch == 3
    loader.sampler.set_epoch(1)  # what Lightning and Accelerate call
    assert keys_of_epoch(loader) == epochs[1], "the same epoch gives the same batches"


def test_lightning_trains_three_epochs_that_differ(dataset, tmp_path):
    L = pytest.importorskip("lightning", reason="Lightning is not installed")
    seen = []

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(3 * 32 * 32, 3)

        def training_step(self, batch, _):
            if self.trainer.current_epoch >= len(seen):
                seen.append([])
            seen[self.trainer.current_epoch].extend(batch["__key__"])
            x = batch["image"].float().flatten(1) / 255
            return torch.nn.functional.cross_entropy(self.net(x), batch["label"])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    loader = st.Loader(dataset, batch_size=8, pipeline=PIPELINE, seed=3)
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(Tiny(), train_dataloaders=loader)
    assert len(seen) == 3
    assert_epochs_advance(seen)


def test_lightning_resumes_a_mid_epoch_checkpoint_with_exactly_the_rest(dataset, tmp_path):
    """Lightning saves the loader's state_dict in its checkpoint and, on fit(ckpt_path=...),
    loads it before the first iter(): the resumed run trains on exactly the batches the
    checkpoint had not yet handed out."""
    L = pytest.importorskip("lightning", reason="Lightning is not installed")

    class Tiny(L.LightningModule):
        def __init__(self, seen, stop_at=None):
            super().__init__()
            self.net = torch.nn.Linear(3 * 32 * 32, 3)
            self.seen, self.stop_at = seen, stop_at

        def training_step(self, batch, i):
            self.seen.append(list(batch["__key__"]))
            if self.stop_at is not None and len(self.seen) == self.stop_at:
                self.trainer.should_stop = True
            x = batch["image"].float().flatten(1) / 255
            return torch.nn.functional.cross_entropy(self.net(x), batch["label"])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def trainer(**kw):
        return L.Trainer(max_epochs=1, accelerator="cpu", logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, **kw)

    first = []
    saved = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3,
                                                save_top_k=-1, filename="{step}")
    trainer(callbacks=[saved]).fit(Tiny(first, stop_at=5),
                                   train_dataloaders=st.Loader(dataset, batch_size=8,
                                                               pipeline=PIPELINE, seed=7))
    assert len(first) == 5
    rest = []
    trainer(enable_checkpointing=False).fit(
        Tiny(rest), train_dataloaders=st.Loader(dataset, batch_size=8, pipeline=PIPELINE,
                                                seed=7),
        ckpt_path=str(tmp_path / "step=3.ckpt"))
    keys = [k for b in first[:3] + rest for k in b]
    assert len(keys) == TOTAL and len(set(keys)) == TOTAL, "not exactly once"
    assert rest[:2] == first[3:5], "the resumed run did not go on in the same order"


def test_tuples_nhwc_dataloader_wrapping_and_copies(dataset):
    loader = st.Loader(dataset, batch_size=8, pipeline=PIPELINE, layout="nhwc",
                       to_tuple=("image", "label"))
    x, y = next(iter(loader))
    assert x.shape == (8, 32, 32, 3) and y.shape == (8,)
    wrapped = torch.utils.data.DataLoader(loader, batch_size=None)
    assert sum(len(y) for _, y in wrapped) == TOTAL
    for clone in (copy.deepcopy(loader), pickle.loads(pickle.dumps(loader))):
        assert sum(len(y) for _, y in clone) == TOTAL


def test_a_dataloader_that_would_batch_the_batches_again_says_batch_size_none(dataset):
    """DataLoader's default batch_size=1 would give image of shape [1, 8, 3, 32, 32]: refused
    at len() (what Lightning asks first) and at iter(), naming the fix; help() lists the
    batch's keys."""
    loader = st.Loader(dataset, batch_size=8, pipeline=PIPELINE)
    for batch_size in (1, 4):
        wrapped = torch.utils.data.DataLoader(loader, batch_size=batch_size)
        with pytest.raises(ValueError, match=r"batch_size=None"):
            len(wrapped)
        with pytest.raises(ValueError, match=rf"DataLoader\(batch_size={batch_size}\)"):
            iter(wrapped)
    assert len(torch.utils.data.DataLoader(loader, batch_size=None)) == 12
    assert len(loader) == 12 and next(iter(loader))["image"].shape == (8, 3, 32, 32)
    doc = st.Loader.__doc__
    for key in ("``image``", "``label``", "``__key__``", "``padding``", "``geometry``",
                "``__source__``"):
        assert key in doc, key


def test_an_eval_loop_may_keep_every_batch_with_copy(dataset):
    loader = st.Loader(dataset, batch_size=8, pipeline=PIPELINE, copy=True, ring_batches=2,
                       remainder="pad")
    kept = list(loader)
    targets = torch.cat([b["label"][~b["padding"]] for b in kept])
    assert len(targets) == TOTAL


@pytest.mark.parametrize("world_size", [1, 3, 8])
def test_an_unshuffled_padded_eval_scores_every_sample_once(dataset, world_size):
    scored = []
    for rank in range(world_size):
        loader = st.Loader(dataset, batch_size=4, pipeline=PIPELINE, rank=rank,
                           world_size=world_size, shuffle="none", remainder="pad", copy=True)
        batches = list(loader)
        assert len(batches) == len(loader)
        scored.extend(k for b in batches for k, pad in zip(b["__key__"], b["padding"]) if not pad)
        again = [k for b in loader for k, pad in zip(b["__key__"], b["padding"]) if not pad]
        assert again == scored[len(scored) - len(again):], "the next epoch is the same"
    assert len(scored) == TOTAL and len(set(scored)) == TOTAL


def test_a_peek_mid_epoch_does_not_spoil_the_checkpoint(dataset):
    loader = st.Loader(dataset, batch_size=8, pipeline=PIPELINE, seed=6)
    it = iter(loader)
    first = [k for _ in range(3) for k in next(it)["__key__"]]
    peek = next(iter(loader))  # what a user does to look at a batch's shapes
    assert len(peek["__key__"]) == 8
    first += next(it)["__key__"]
    state = loader.state_dict()
    del it
    again = st.Loader(dataset, batch_size=8, pipeline=PIPELINE, seed=6)
    again.load_state_dict(state)
    rest = keys_of_epoch(again)
    assert len(first + rest) == TOTAL and len(set(first + rest)) == TOTAL


def test_a_checkpoint_resumes_exactly_the_rest(dataset):
    loader = st.Loader(dataset, batch_size=8, pipeline=PIPELINE, seed=5)
    keys_of_epoch(loader)  # epoch 0
    it = iter(loader)      # epoch 1
    first = [k for _ in range(4) for k in next(it)["__key__"]]
    state = loader.state_dict()
    del it
    again = st.Loader(dataset, batch_size=8, pipeline=PIPELINE, seed=5)
    again.load_state_dict(state)
    assert again.epoch == 1
    rest = keys_of_epoch(again)
    assert sorted(first + rest) == sorted(set(first + rest)) and len(first + rest) == TOTAL
    assert again.epoch == 2


RANK_SCRIPT = """
import sys
import torch.distributed as dist
import sluice.torch as st
dist.init_process_group("gloo")
try:
    st.Loader(sys.argv[1], batch_size=8, pipeline="decode | resize 40 | center_crop 32")
    print("OK")
except ValueError as e:
    print("REFUSED", e)
    sys.exit(3)
finally:
    # Without it torch's gloo threads may abort the process at exit ("terminate called
    # without an active exception"), as torch's docs warn.
    dist.destroy_process_group()
"""


def run_ranks(manifests, tmp_path):
    """Starts one process per manifest as torchrun would (RANK, WORLD_SIZE, MASTER_*);
    returns [(exit code, output)]."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    procs = []
    for rank, m in enumerate(manifests):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(len(manifests)),
               "LOCAL_WORLD_SIZE": str(len(manifests)), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, str(script), str(m)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    return [(p.wait(timeout=120), p.stdout.read()) for p in procs]


def test_ranks_that_load_different_datasets_refuse_before_the_first_batch(dataset, tmp_path):
    import json
    import pathlib

    src = pathlib.Path(dataset)
    manifest = json.loads(src.read_text())
    for s in manifest["shards"]:
        s["url"] = str(src.parent / s["url"])
    manifest["shards"] = manifest["shards"][:-1]
    short = tmp_path / "short.json"
    short.write_text(json.dumps(manifest))

    for code, out in run_ranks([src, src], tmp_path):
        assert code == 0 and "OK" in out, out
    for code, out in run_ranks([src, short], tmp_path):
        assert code == 3, out
        assert "loaded different datasets" in out and "9 shards" in out, out


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_dataloader_with_workers_raises_at_once_naming_the_fix(dataset, method):
    """Each DataLoader worker would read the whole epoch (spawn), or hang on threads it does
    not have (fork): the loader refuses to run in one, and the error reaches the loop."""
    import time

    loader = st.Loader(dataset, batch_size=8, pipeline=PIPELINE)
    wrapped = torch.utils.data.DataLoader(loader, batch_size=None, num_workers=2,
                                          multiprocessing_context=method)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"DataLoader worker.*num_workers=0"):
        for _ in wrapped:
            raise AssertionError("a batch came out of a DataLoader worker")
    print(f"{method}: raised after {time.monotonic() - started:.2f} s")
    # The loader itself is untouched, and num_workers=0 reads the epoch once.
    assert sum(len(b["label"]) for b in torch.utils.data.DataLoader(loader, batch_size=None)) \
        == TOTAL


def test_a_dropped_loader_is_freed_at_once(dataset):
    import gc
    import weakref

    gc.disable()
    try:
        loader = st.Loader(dataset, batch_size=8, pipeline=PIPELINE)
        it = iter(loader)
        next(it)
        gone = weakref.ref(loader)
        del it, loader
        assert gone() is None, "the loader outlived its last reference (a reference cycle)"
    finally:
        gc.enable()


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        import gc

        gc.collect()  # what the cycle collector may do in any worker, at any time
        return torch.tensor([i * i])


def test_forked_dataloaders_beside_a_loader_run_clean_ten_times(dataset):
    """A torchvision-style val loader (fork) in a process that made, read and dropped Sluice
    loaders: the workers never tear down the parent's threads."""
    kept = st.Loader(dataset, batch_size=8, pipeline=PIPELINE)
    kept_epoch = iter(kept)
    next(kept_epoch)  # a loader mid-epoch in the parent, copied into every child
    for _ in range(10):
        loader = st.Loader(dataset, batch_size=8, pipeline=PIPELINE)
        next(iter(loader))
        del loader
        val = torch.utils.data.DataLoader(Squares(), batch_size=4, num_workers=2,
                                          multiprocessing_context="fork")
        assert torch.cat(list(val)).flatten().tolist() == [i * i for i in range(16)]
    assert sum(len(b["label"]) for b in kept_epoch) == TOTAL - 8, "the parent's loader went on"


def test_a_forked_child_neither_reads_nor_tears_down_the_parents_loader(dataset):
    import gc
    import os

    loader = st.Loader(dataset, batch_size=8, pipeline=PIPELINE)
    it = iter(loader)
    batch = next(it)
    pid = os.fork()
    if pid == 0:  # the child: any exception is a non-zero exit
        code = 1
        try:
            try:
                next(iter(loader))
            except RuntimeError as e:
                code = 0 if "forked from it" in str(e) else 2
            del it, loader, batch
            gc.collect()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sum(len(b["label"]) for b in it) == TOTAL - 8, "the parent's loader went on"


def fielded(sluice_bin, tmp_path, dataset, bad_caption_at=None, extra=None):
    """40 samples with a caption each (one not UTF-8 if asked) and `extra` fields."""
    from conftest import first_jpeg, indexed_shard

    jpeg = first_jpeg(dataset)
    samples = []
    for i in range(40):
        txt = b"\xff\xfe not utf-8" if i == bad_caption_at else f"caption {i}".encode()
        fields = [("jpg", jpeg), ("cls", str(i % 3).encode()), ("txt", txt)]
        samples.append((f"s{i:03d}", fields + list((extra or {}).items())))
    return indexed_shard(sluice_bin, tmp_path / "f-000000.tar", samples)


def test_one_bad_caption_costs_one_row_not_the_epoch(dataset, sluice_bin, tmp_path, caplog):
    import logging

    caplog.set_level(logging.WARNING, logger="sluice")
    manifest = fielded(sluice_bin, tmp_path, dataset, bad_caption_at=7)
    loader = st.Loader(manifest, batch_size=8, pipeline=PIPELINE, fields=["txt"])
    rows = {}
    for batch in loader:
        rows.update(zip(batch["__key__"], batch["txt"]))
    assert len(rows) == 40 and rows["s007"] is None
    assert all(rows[f"s{i:03d}"] == f"caption {i}" for i in range(40) if i != 7)
    warned = [r.getMessage() for r in caplog.records if "s007" in r.getMessage()]
    assert warned and "'txt'" in warned[0], warned


def test_a_field_cannot_replace_the_batchs_own_keys(dataset, sluice_bin, tmp_path):
    manifest = fielded(sluice_bin, tmp_path, dataset, extra={"label": b"not a label"})
    with pytest.raises(ValueError, match=r"'label' is one of the batch's own keys"):
        st.Loader(manifest, batch_size=8, pipeline=PIPELINE, fields=["txt", "label"])
    loader = st.Loader(manifest, batch_size=8, pipeline=PIPELINE, fields="all")
    batch = next(iter(loader))
    assert batch["label"].dtype == torch.int64
    assert batch["field:label"] == [b"not a label"] * 8


def test_shuffle_none_without_a_remainder_warns_that_samples_go_unscored(dataset):
    with pytest.warns(UserWarning, match=r'6 of the dataset.s 90 samples are not read.*"pad"'):
        st.Loader(dataset, batch_size=8, pipeline=PIPELINE, shuffle="none", rank=0,
                  world_size=7)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        st.Loader(dataset, batch_size=8, pipeline=PIPELINE, shuffle="none", rank=0,
                  world_size=7, remainder="pad")
        st.Loader(dataset, batch_size=8, pipeline=PIPELINE, shuffle="none", rank=0,
                  world_size=3)


def test_a_break_out_of_an_epoch_logs_no_error(dataset, caplog):
    import logging
    import time

    caplog.set_level(logging.DEBUG, logger="sluice")
    loader = st.Loader(dataset, batch_size=8, pipeline=PIPELINE)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    time.sleep(0.5)
    next(iter(loader))  # logs reach Python on the loader's next call
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], errors


def test_one_ranks_state_resumes_every_rank_and_len_counts_the_resumed_epoch(dataset):
    """Rank 0's state (all a Lightning or Accelerate checkpoint holds) resumes rank 1 at its
    own place, and at 3 ranks the rest is split; len() of a resumed epoch counts the batches
    before the checkpoint too, and a len() read before the load that is now short warns."""
    ranks = [st.Loader(dataset, batch_size=8, pipeline=PIPELINE, seed=4, rank=r, world_size=2)
             for r in range(2)]
    whole = [[k for b in loader for k in b["__key__"]] for loader in ranks]
    for loader in ranks:
        loader.set_epoch(0)
    its = [iter(loader) for loader in ranks]
    before = [[k for _ in range(3) for k in next(it)["__key__"]] for it in its]
    state = ranks[0].state_dict()
    del its
    for r in range(2):
        again = st.Loader(dataset, batch_size=8, pipeline=PIPELINE, seed=4, rank=r,
                          world_size=2)
        again.load_state_dict(state)
        assert len(again) == 6
        assert before[r] + [k for b in again for k in b["__key__"]] == whole[r]
    rest = []
    for r in range(3):
        three = st.Loader(dataset, batch_size=8, pipeline=PIPELINE, seed=4, rank=r,
                          world_size=3)
        assert len(three) == 4
        with pytest.warns(UserWarning, match="has 5 batches as the loop counts them, but "
                          "len.. said 4"):
            three.load_state_dict(state)
        assert len(three) == 5
        rest += [k for b in three for k in b["__key__"]]
    every = before[0] + before[1] + rest
    assert len(every) == TOTAL and len(set(every)) == TOTAL


def test_a_plain_loader_takes_its_rank_from_an_initialized_process_group(dataset, monkeypatch,
                                                                          tmp_path):
    """torch.distributed first, for both loaders: RANK and WORLD_SIZE that disagree with the
    process group lose to it (the one place that decides it is sluice/_env.py)."""
    import sluice
    import torch.distributed as dist

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    try:
        loader = sluice.Loader(dataset=dataset, pipeline=PIPELINE, batch_size=8)
        identity = loader.dataset_identity
        assert (identity["rank"], identity["world_size"]) == (0, 1)
    finally:
        dist.destroy_process_group()


def test_to_tuple_keys_are_checked_at_construction(dataset):
    with pytest.raises(ValueError, match=r"to_tuple: 'lable' is not a key of this loader's "
                                         r"batches, which are \['image', 'label'"):
        st.Loader(dataset, batch_size=8, pipeline=PIPELINE, to_tuple=("image", "lable"))
    with pytest.raises(ValueError, match=r"'txt'.*ask for it with fields=\[\"txt\"\]"):
        st.Loader(dataset, batch_size=8, pipeline=PIPELINE, to_tuple=("image", "txt"))
    with pytest.raises(ValueError, match=r"'frames'.*only a clip pipeline"):
        st.Loader(dataset, batch_size=8, pipeline=PIPELINE, to_tuple=("image", "frames"))
    loader = st.Loader(dataset, batch_size=8, pipeline=PIPELINE, fields=["cls"],
                       to_tuple=("image", "label", "cls"))
    image, label, cls = next(iter(loader))
    assert image.shape[0] == label.shape[0] == len(cls) == 8
