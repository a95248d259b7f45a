"""The Python binding against in-process decoding and real `sluice cpu` daemons: exactly once,
zero copy through DLPack, the buffer lifetime rule, checkpoints, and clear errors."""

import _thread
import json
import math
import pathlib
import subprocess
import threading

import numpy as np
import pytest

import sluice
from conftest import first_jpeg, indexed_shard, storage_node

PIPELINE = "decode | resize 40 | center_crop 32"
TOTAL = 90


def ids_of(epoch):
    ids = []
    for images, labels in epoch:
        x = np.from_dlpack(images)
        y = np.from_dlpack(labels)
        assert x.shape == (len(images), 32, 32, 3) and x.dtype == np.uint8
        assert y.shape == (len(images),) and y.dtype == np.int64
        assert set(y.tolist()) <= {0, 1, 2}
        ids.extend(images.ids)
    return ids


def test_in_process_epoch_delivers_every_sample_once(dataset):
    loader = sluice.Loader(dataset=dataset, batch_size=8, pipeline=PIPELINE, threads=2)
    assert len(loader) == math.ceil(TOTAL / 8)
    epoch = loader.epoch(0)
    ids = ids_of(epoch)
    assert len(ids) == TOTAL and len(set(ids)) == TOTAL
    report = epoch.report()
    assert report["delivered"] == TOTAL and report["duplicates_dropped"] == 0


def test_batches_are_zero_copy_and_not_reused_while_held(dataset):
    # Three buffers: the held one, the loop's current batch, and the one being filled.
    loader = sluice.Loader(dataset=dataset, batch_size=8, pipeline=PIPELINE, ring_batches=3)
    epoch = loader.epoch(0)
    images, labels = next(epoch)
    held = np.from_dlpack(images)
    # numpy wraps the loader's buffer: the same address, no copy.
    assert held.ctypes.data == images.data_ptr
    assert np.from_dlpack(labels).ctypes.data == labels.data_ptr
    snapshot = held.copy()
    del images, labels
    later = []
    for images, _ in epoch:
        later.append(images.data_ptr)
    # The held buffer was never handed out again, and its bytes are intact.
    assert held.ctypes.data not in later
    assert np.array_equal(held, snapshot)
    # Released buffers are reused: two of the three kept turning over.
    assert len(set(later)) == 2


def test_holding_every_buffer_is_an_error_not_a_hang(dataset):
    """A loop that keeps every batch of the ring gets the error at its next batch: a short
    grace (another thread of it could drop one), not the 5 s one for a ring that is full for
    other reasons. The bound sits between the two graces (0.3 s and 5 s): not a speed."""
    import time
    loader = sluice.Loader(dataset=dataset, batch_size=8, pipeline=PIPELINE, ring_batches=2)
    epoch = loader.epoch(0)
    held = [next(epoch), next(epoch)]
    started = time.monotonic()
    with pytest.raises(sluice.SluiceError, match="ring buffers"):
        next(epoch)
    assert time.monotonic() - started < 4.5, "the long grace, not the short one"
    del held


def test_a_checkpoint_resumes_exactly_the_rest(dataset):
    first = sluice.Loader(dataset=dataset, batch_size=8, pipeline=PIPELINE, seed=3)
    epoch = first.epoch(2)
    got = []
    for _ in range(4):
        images, _ = next(epoch)
        got.extend(images.ids)
    state = first.state_dict()
    text = json.dumps(state)  # checkpoints are plain data, like torch's
    del epoch, first
    second = sluice.Loader(dataset=dataset, batch_size=8, pipeline=PIPELINE, seed=3)
    second.load_state_dict(json.loads(text))
    rest = ids_of(iter(second))  # plain iteration resumes the checkpoint's epoch
    assert len(got) + len(rest) == TOTAL
    assert set(got).isdisjoint(rest) and len(set(got) | set(rest)) == TOTAL


def test_the_same_seed_gives_the_same_batches_and_labels_are_mixed(dataset):
    def batches(**kw):
        loader = sluice.Loader(dataset=dataset, batch_size=8, pipeline=PIPELINE, seed=5, **kw)
        return [(list(images.ids), np.from_dlpack(labels).tolist()) for images, labels in loader]

    one, two = batches(threads=1), batches(threads=2)
    assert one == two, "plan order: the same batches whatever the decode threads"
    distinct = sum(len(set(labels)) for _, labels in one) / len(one)
    assert distinct > 2.0, f"{distinct:.2f} classes per batch of 8 out of 3"
    arrival = batches(order="arrival")
    assert sorted(i for b, _ in arrival for i in b) == sorted(i for b, _ in one for i in b)


def test_epochs_started_early_deliver_the_same_batches(dataset):
    early = sluice.Loader(dataset=dataset, batch_size=8, pipeline=PIPELINE, seed=5, epochs=3)
    asked = sluice.Loader(
        dataset=dataset, batch_size=8, pipeline=PIPELINE, seed=5, prefetch_next_epoch=False
    )
    for e in range(3):
        got = ids_of(early.epoch(e))
        assert got == ids_of(asked.epoch(e)), f"epoch {e}"
        assert len(got) == TOTAL


def test_states_of_two_ranks_resume_at_three_with_exactly_the_rest(dataset):
    states, got = [], []
    for rank in range(2):
        loader = sluice.Loader(dataset=dataset, batch_size=5, pipeline=PIPELINE, seed=3,
                               rank=rank, world_size=2)
        epoch = loader.epoch(1)
        for _ in range(3):
            images, _ = next(epoch)
            got.extend(images.ids)
        states.append(json.loads(json.dumps(loader.state_dict())))
        del epoch, loader
    rest = {}
    for rank in range(3):
        loader = sluice.Loader(dataset=dataset, batch_size=5, pipeline=PIPELINE, seed=3,
                               rank=rank, world_size=3)
        loader.load_state_dict(states)
        rest[rank] = [i for images, _ in loader for i in images.ids]
    # 90 samples, 30 delivered: 60 left, 20 for each new rank.
    assert [len(r) for r in rest.values()] == [20, 20, 20]
    everything = got + [i for r in rest.values() for i in r]
    assert len(everything) == TOTAL and len(set(everything)) == TOTAL
    states[1]["batches"] = 2
    loader = sluice.Loader(dataset=dataset, batch_size=5, pipeline=PIPELINE, seed=3,
                           rank=0, world_size=3)
    with pytest.raises(ValueError, match="global step"):
        loader.load_state_dict(states)


def test_set_epoch_reshuffles_and_rank_comes_from_the_environment(dataset, monkeypatch):
    loader = sluice.Loader(dataset=dataset, batch_size=8, pipeline=PIPELINE)
    order0 = [i for images, _ in loader for i in images.ids]
    loader.set_epoch(1)
    order1 = [i for images, _ in loader for i in images.ids]
    assert sorted(order0) == sorted(order1) and order0 != order1
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ranked = sluice.Loader(dataset=dataset, batch_size=8, pipeline=PIPELINE)
    assert len(ranked) == math.ceil(TOTAL / 2 / 8)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_size": 0}, "batch_size"),
        ({"shuffle": "sideways"}, "shuffle"),
        ({"order": "random"}, "order"),
        ({"device": "gpu:0"}, "device"),
        ({"dtype": "float16"}, "needs device"),
        ({"dtype": "int8", "device": "cuda:0"}, "dtype"),
        ({"std": (0.2, 0.0, 0.2), "device": "cuda:0"}, "std: every value must be positive"),
        ({"mean": "abc"}, "mean: expected three numbers"),
        ({"threads": 0}, "threads"),
        ({"max_decoded_bytes": 0}, "max_decoded_bytes"),
        ({"workers": ["127.0.0.1:1"]}, "trust_cert"),
        ({"rank": 3, "world_size": 2}, "rank"),
        ({"world_size": 1000}, "world_size"),
        ({"job_weight": 0}, "job_weight"),
        ({"job_name": ""}, "job_name"),
        ({"workers_file": "/nonexistent/sluice-workers"}, "workers_file"),
        ({"workers_file": __file__}, "workers_file"),  # not one host:port a line
        ({"workers": ["127.0.0.1:1"], "trust_cert": __file__, "workers_refresh": 0},
         "workers_refresh"),
    ],
)
def test_bad_arguments_raise_value_errors_that_name_them(dataset, kwargs, message):
    with pytest.raises(ValueError, match=message):
        sluice.Loader(dataset=dataset, pipeline=PIPELINE, **kwargs)


def test_a_missing_dataset_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="dataset"):
        sluice.Loader(dataset=str(tmp_path / "nope.json"))


def test_against_a_running_worker(dataset, worker):
    # A named, weighted job, as jobs sharing a pool are (docs/operations.md).
    loader = sluice.Loader(dataset=dataset, workers=[worker.addr], batch_size=16,
                           pipeline=PIPELINE, token_file=worker.token_file,
                           trust_cert=worker.cert, job_name="resnet-test", job_weight=2)
    ids = ids_of(loader.epoch(0))
    assert len(ids) == TOTAL and len(set(ids)) == TOTAL
    stats = loader.stats()
    assert stats["samples"] == TOTAL and stats["workers"][0][0] == worker.addr


def test_rust_errors_become_sluice_errors(dataset, worker, tmp_path):
    bad = tmp_path / "bad-token"
    bad.write_text("not-the-token\n")
    loader = sluice.Loader(dataset=dataset, workers=[worker.addr], pipeline=PIPELINE,
                           token_file=str(bad), trust_cert=worker.cert)
    with pytest.raises(sluice.SluiceError, match="wrong cluster token"):
        next(iter(loader))
    empty = tmp_path / "empty-token"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="empty-token: the file's first line is empty"):
        sluice.Loader(dataset=dataset, workers=[worker.addr], pipeline=PIPELINE,
                      token_file=str(empty), trust_cert=worker.cert)


def test_ctrl_c_interrupts_a_wait(dataset, worker):
    worker.stop()  # nothing answers: the loader waits for a worker
    loader = sluice.Loader(dataset=dataset, workers=[worker.addr], pipeline=PIPELINE,
                           token_file=worker.token_file, trust_cert=worker.cert)
    threading.Timer(0.5, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        next(iter(loader))


def test_a_checkpoint_follows_the_shards_to_another_place(dataset, sluice_bin, tmp_path):
    """Checkpoints name the dataset by its shards' content: one taken mid-epoch resumes after
    the shards were copied to another directory and indexed there, and from a manifest a
    storage node serves them by (its URLs are http://)."""
    import pathlib
    import shutil
    import subprocess

    src = pathlib.Path(dataset).parent
    loader = sluice.Loader(dataset=dataset, batch_size=8, pipeline=PIPELINE, seed=6)
    epoch = loader.epoch(0)
    before = [i for _ in range(3) for i in next(epoch)[0].ids]
    state = json.loads(json.dumps(loader.state_dict()))
    del epoch, loader

    moved = tmp_path / "store" / "train"
    moved.mkdir(parents=True)
    for shard in src.glob("s-*.tar"):
        shutil.copy(shard, moved / shard.name)
    shards = sorted(str(p) for p in moved.glob("*.tar"))
    subprocess.run([sluice_bin, "index", *shards, "--output", str(moved / "m.json")],
                   check=True, capture_output=True)
    again = sluice.Loader(dataset=str(moved / "m.json"), batch_size=8, pipeline=PIPELINE, seed=6)
    again.load_state_dict(state)
    epoch = again.epoch(0)
    assert len(epoch) == len(again) - 3, "len() of a resumed epoch is the batches left"
    rest = [i for images, _ in epoch for i in images.ids]
    assert len(before) + len(rest) == TOTAL and len(set(before + rest)) == TOTAL

    with storage_node(sluice_bin, tmp_path / "store") as addr:
        served = json.loads((moved / "m.json").read_text())
        for s in served["shards"]:
            s["url"] = f"http://{addr}/v1/train/{pathlib.Path(s['url']).name}"
        (tmp_path / "served.json").write_text(json.dumps(served))
        remote = sluice.Loader(dataset=str(tmp_path / "served.json"), batch_size=8,
                               pipeline=PIPELINE, seed=6)
        remote.load_state_dict(state)
        assert [i for images, _ in remote for i in images.ids] == rest

    # A dataset whose shards differ is refused, naming the first shard that does.
    first = sorted(moved.glob("*.tar"))[0]
    first.write_bytes(first.read_bytes()[:-1024])
    subprocess.run([sluice_bin, "index", *shards, "--output", str(moved / "m.json")],
                   capture_output=True)
    changed = sluice.Loader(dataset=str(moved / "m.json"), batch_size=8, pipeline=PIPELINE,
                            seed=6)
    with pytest.raises(ValueError, match=r"shard #0 .*s-000000\.tar"):
        changed.load_state_dict(state)


def test_the_state_before_the_first_batch_loads_as_the_start_of_the_epoch(dataset):
    loader = sluice.Loader(dataset=dataset, batch_size=8, pipeline=PIPELINE, seed=2)
    state = loader.state_dict()
    assert state == {}
    fresh = sluice.Loader(dataset=dataset, batch_size=8, pipeline=PIPELINE, seed=2)
    fresh.load_state_dict(state)
    fresh.load_state_dict([{}, {}])
    assert ids_of(fresh.epoch(0)) == ids_of(loader.epoch(0))


@pytest.mark.parametrize("pipeline, message", [
    ("decode | resize 32 | center_crop 32 | hflip 2.0", "hflip"),
    ("RandomResizedCrop(224)", "pipeline"),
    ("decode", "output size is not fixed"),
])
def test_a_bad_pipeline_is_a_value_error_at_construction(dataset, pipeline, message):
    with pytest.raises(ValueError, match=message):
        sluice.Loader(dataset=dataset, pipeline=pipeline)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"num_workers": 8}, TypeError, "sluice cpu workers"),
    ({"pin_memory": True}, TypeError, "page-locked"),
    ({"sampler": None}, TypeError, "plans each epoch"),
    ({"collate_fn": list}, TypeError, "already tensors"),
    ({"colour": 1}, TypeError, "unexpected keyword argument 'colour'"),
    ({"shuffle": False, "order": "arrival"}, ValueError, "manifest order"),
    ({"workers": "127.0.0.1:7100"}, ValueError, "trust_cert"),
    ({"remainder": "spread"}, ValueError, "remainder"),
    ({"same_host": "maybe"}, ValueError, "same_host"),
    ({"worker_wait": -1.0}, ValueError, "worker_wait"),
    ({"lookahead": 1}, ValueError, "lookahead"),
])
def test_dataloader_habits_get_errors_that_say_the_sluice_way(dataset, kwargs, error, message):
    with pytest.raises(error, match=message):
        sluice.Loader(dataset=dataset, pipeline=PIPELINE, batch_size=8, **kwargs)


def test_paths_true_shuffle_and_one_worker_string_are_accepted(dataset, tmp_path):
    import pathlib

    loader = sluice.Loader(dataset=pathlib.Path(dataset), pipeline=PIPELINE, batch_size=8,
                           shuffle=True, fail_on_bad_sample=False, max_unit_samples=16)
    assert len(ids_of(loader.epoch(0))) == TOTAL
    with pytest.raises(ValueError, match="no manifest at"):
        sluice.Loader(dataset=tmp_path / "missing.json")


def test_an_epoch_whose_first_samples_are_all_skipped_raises_before_any_batch(dataset, caplog):
    import logging

    caplog.set_level(logging.WARNING, logger="sluice")
    # These samples have no txt field to decode an image from: every one is skipped. The
    # loop never sees an empty batch: the epoch raises once 32 samples were skipped, none
    # delivered, with the reason.
    loader = sluice.Loader(dataset=dataset, batch_size=8, epochs=1,
                           pipeline="decode field=txt | resize 40 | center_crop 32")
    handed = []
    with pytest.raises(sluice.SluiceError, match="the first 32 samples of epoch 0 were all "
                       "skipped.*no image field"):
        for images, _ in loader.epoch(0):
            handed.append(len(images))
    assert handed == [], "an empty batch reached the loop"
    # Said once, by the error: no line per skipped sample before it.
    skips = [r for r in caplog.records if r.name.startswith("sluice.")
             and "skipped" in r.getMessage()]
    assert skips == [], [r.getMessage() for r in skips[:3]]


def test_a_label_the_data_does_not_have_raises_before_any_batch(dataset, sluice_bin, tmp_path):
    """A detection dataset (boxes in JSON, no .cls) read with the default label="cls"."""
    jpeg = first_jpeg(dataset)
    boxes = json.dumps({"boxes": [[1, 2, 3, 4]]}).encode()
    det = indexed_shard(sluice_bin, tmp_path / "det-000000.tar",
                        [(f"d{i:03d}", [("jpg", jpeg), ("json", boxes)]) for i in range(40)])
    loader = sluice.Loader(dataset=det, batch_size=8, pipeline=PIPELINE)
    with pytest.raises(sluice.SluiceError, match=r"were all skipped.*cls"):
        for _ in loader.epoch(0):
            raise AssertionError("a batch reached the loop")
    unlabeled = sluice.Loader(dataset=det, batch_size=8,
                              pipeline=PIPELINE, label=None, fields=["json"])
    assert sum(len(i) for i, _ in unlabeled.epoch(0)) == 40


@pytest.mark.parametrize("shuffle", ["none", "global"])
@pytest.mark.parametrize("world_size", [1, 3, 8])
def test_pad_scores_every_sample_exactly_once_at_any_world_size(dataset, world_size, shuffle):
    scored, batches = [], set()
    for rank in range(world_size):
        # Ranks share a seed, except under "none", where the seed changes nothing.
        seed = rank if shuffle == "none" else 1
        loader = sluice.Loader(dataset=dataset, batch_size=4, pipeline=PIPELINE, seed=seed,
                               rank=rank, world_size=world_size, remainder="pad",
                               shuffle=shuffle)
        mine = []
        for e in range(2):
            n, got = 0, []
            for images, _ in loader.epoch(e):
                n += 1
                got.extend(i for i, pad in zip(images.ids, images.padding) if not pad)
            batches.add(n)
            if shuffle == "none" and e == 1:
                assert got == mine, f"rank {rank}: epoch 1 is not epoch 0"
            mine = mine or got
        scored.extend(mine)
    assert len(batches) == 1, f"equal steps on every rank: {batches}"
    assert len(scored) == TOTAL and len(set(scored)) == TOTAL
    if shuffle == "none":
        # Rank after rank, the manifest in order, whatever the seed.
        assert scored == sorted(scored)


def test_a_peek_mid_epoch_does_not_spoil_the_checkpoint(dataset):
    loader = sluice.Loader(dataset=dataset, batch_size=8, pipeline=PIPELINE, seed=4)
    epoch = loader.epoch(0)
    got = []
    for _ in range(3):
        got.extend(next(epoch)[0].ids)
    first, _ = next(loader.epoch(0))  # a look at a batch, mid-epoch
    del first
    got.extend(next(epoch)[0].ids)
    state = loader.state_dict()
    assert state["batches"] == 4
    del epoch
    again = sluice.Loader(dataset=dataset, batch_size=8, pipeline=PIPELINE, seed=4)
    again.load_state_dict(state)
    rest = ids_of(again.epoch(0))
    assert len(got + rest) == TOTAL and len(set(got + rest)) == TOTAL


def test_dataset_may_be_a_served_manifest_url_or_a_pattern_of_indexed_shards(dataset, sluice_bin,
                                                                           tmp_path):
    import urllib.request

    bucket, _ = served_bucket(dataset, tmp_path / "store")
    reference = sluice.Loader(dataset=dataset, pipeline=PIPELINE)

    # Shards named by a brace pattern, described from their .idx sidecars.
    pattern = f"{bucket}/s-{{000000..000008}}.tar"
    by_pattern = sluice.Loader(dataset=pattern, batch_size=8, pipeline=PIPELINE)
    assert by_pattern.dataset_identity["fingerprint"] == reference.dataset_identity["fingerprint"]
    assert len(ids_of(by_pattern.epoch(0))) == TOTAL

    with storage_node(sluice_bin, tmp_path / "store") as addr:
        url = f"http://{addr}/v1/train/manifest.json"
        served = sluice.Loader(dataset=url, batch_size=8, pipeline=PIPELINE)
        assert served.dataset_identity["fingerprint"] == reference.dataset_identity["fingerprint"]
        assert len(ids_of(served.epoch(0))) == TOTAL
        metrics = urllib.request.urlopen(f"http://{addr}/metrics").read().decode()
        sent = sum(float(line.split()[-1]) for line in metrics.splitlines()
                   if line.startswith("sluice_storage_bytes_sent_total"))
        assert sent > 0, "the shards came from the storage node, resolved against the URL"
        with pytest.raises(ValueError, match="dataset"):
            sluice.Loader(dataset=f"http://{addr}/v1/train/missing.json")


def test_the_loader_documents_every_argument_and_the_stubs_match_the_extension():
    """The argument list exists once, in ``sluice.Loader``'s signature (python/sluice/
    _loader.py, typed): its docstring documents each argument, and the stub of the Rust
    class underneath (_sluice.pyi) must not drift from the runtime's own signature."""
    import ast
    import inspect
    import pathlib

    doc = inspect.getdoc(sluice.Loader)
    runtime = [n for n, p in inspect.signature(sluice.Loader).parameters.items()
               if p.kind is not p.VAR_KEYWORD]
    for name in runtime:
        assert f"{name}:" in doc or f", {name}:" in doc or f"{name}," in doc, \
            f"{name} undocumented"
    stub = pathlib.Path(sluice.__file__).with_name("_sluice.pyi")
    tree = ast.parse(stub.read_text())
    init = next(f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "_Loader"
                for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    stubbed = [a.arg for a in init.args.args[1:] + init.args.kwonlyargs]
    extension = [n for n in inspect.signature(sluice._sluice._Loader).parameters]
    assert stubbed == extension
    assert sluice.__version__ != "0+unknown"


def test_the_stub_matches_the_extension_class_by_class_and_function_by_function():
    """Every class and function of the extension (``sluice._sluice``) is in its stub
    (_sluice.pyi), with the same base class, the same methods and properties, and the same
    parameter names wherever the extension states them; nothing is stubbed that it lacks."""
    import ast
    import inspect
    import pathlib

    ext = sluice._sluice
    stub = ast.parse(pathlib.Path(sluice.__file__).with_name("_sluice.pyi").read_text())
    classes = {c.name: c for c in stub.body if isinstance(c, ast.ClassDef)}
    functions = {f.name: f for f in stub.body if isinstance(f, ast.FunctionDef)}
    public = {n: getattr(ext, n) for n in dir(ext) if not n.startswith("__")}
    assert set(classes) == {n for n, o in public.items() if inspect.isclass(o)}
    assert set(functions) == {n for n, o in public.items()
                              if callable(o) and not inspect.isclass(o)}

    def params(node):
        a = node.args
        names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
        return [n for n in names if n not in ("self", "cls")]

    def same_signature(where, node, runtime):
        try:
            signature = inspect.signature(runtime)
        except (TypeError, ValueError):
            return  # the extension states none (a slot wrapper)
        stated = [n for n in signature.parameters if n not in ("self", "cls", "$self")]
        assert params(node) == stated, f"{where}: stub {params(node)}, extension {stated}"

    plumbing = {"__doc__", "__module__", "__new__", "__weakref__", "__dict__"}
    for name, node in classes.items():
        cls = public[name]
        bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
        assert bases == [b.__name__ for b in cls.__bases__ if b is not object], name
        stubbed = {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}
        own = set(vars(cls)) - plumbing
        assert set(stubbed) - {"__init__"} == own, \
            f"{name}: stub only {set(stubbed) - {'__init__'} - own}, extension only " \
            f"{own - set(stubbed)}"
        for method, f in stubbed.items():
            if method == "__init__":
                same_signature(f"{name}()", f, cls)
            elif callable(vars(cls)[method]):
                same_signature(f"{name}.{method}", f, getattr(cls, method))
    for name, f in functions.items():
        same_signature(name, f, public[name])


def labelled_shard(dataset, sluice_bin, tmp_path, labels):
    """One shard of the dataset's first JPEG under each of `labels` (cls bytes)."""
    jpeg = first_jpeg(dataset)
    return indexed_shard(sluice_bin, tmp_path / "lab-000000.tar",
                         [(f"l{i:03d}", [("jpg", jpeg), ("cls", label)])
                          for i, label in enumerate(labels)])


def test_labels_that_would_crash_the_loss_are_named_skips(dataset, sluice_bin, tmp_path):
    labels = [b"-3", b"0", b"1", b"2", b"-100", b"7", b"99999999999999999999999", b"1"]
    manifest = labelled_shard(dataset, sluice_bin, tmp_path, labels)

    def read(**kwargs):
        loader = sluice.Loader(dataset=manifest, batch_size=4, pipeline=PIPELINE,
                               shuffle="none", **kwargs)
        got, skipped = [], []
        for images, labels_ in loader.epoch(0):
            got += np.from_dlpack(labels_).tolist()
            skipped += [why for _, why in images.skipped]
        return sorted(got), skipped

    got, skipped = read()
    assert got == [0, 1, 1, 2, 7]
    assert sum("is negative" in why for why in skipped) == 2, skipped
    assert any("too large for a 64-bit label" in why for why in skipped), skipped
    got, skipped = read(num_classes=3)
    assert got == [0, 1, 1, 2]
    assert any("label: 7 is out of range for num_classes=3" in why for why in skipped), skipped
    got, _ = read(allow_negative_labels=True)
    assert got == [-100, -3, 0, 1, 1, 2, 7]
    with pytest.raises(ValueError, match="is empty"):
        sluice.Loader(dataset=manifest, label="")


def test_checkpoint_errors_are_value_errors_in_plain_words(dataset):
    loader = sluice.Loader(dataset=dataset, batch_size=8, pipeline=PIPELINE)
    with pytest.raises(ValueError, match=r"not a Sluice loader's state_dict\(\) \(missing field"):
        loader.load_state_dict({"version": 2})
    with pytest.raises(ValueError) as e:
        loader.load_state_dict({"version": 2, "seed": "x"})
    assert "line 1 column" not in str(e.value)


def test_top_up_keeps_every_batch_full_despite_skips(dataset, sluice_bin, tmp_path):
    labels = [b"-1", b"0", b"1", b"-2", b"2", b"0", b"-3", b"1"]
    manifest = labelled_shard(dataset, sluice_bin, tmp_path, labels)
    loader = sluice.Loader(dataset=manifest, batch_size=4, pipeline=PIPELINE, shuffle="none",
                           top_up=True)
    sizes, real = [], []
    for images, labels_ in loader.epoch(0):
        sizes.append(len(images))
        real += [y for y, pad in zip(np.from_dlpack(labels_).tolist(), images.padding)
                 if not pad]
    assert sizes == [4, 4] and sorted(real) == [0, 0, 1, 1, 2]


def test_settings_that_leave_no_batch_are_refused(dataset):
    with pytest.raises(ValueError, match=r"each of the 100 ranks gets 1 .*no batch at all"):
        sluice.Loader(dataset=dataset, batch_size=8, pipeline=PIPELINE, shuffle="none",
                      remainder="pad", drop_last=True, rank=0, world_size=100)


def test_a_worker_that_refuses_the_handshake_is_left_out(dataset, sluice_bin, tmp_path, caplog):
    """A worker restarted with a new certificate (the client does not trust it) leaves the
    epoch on the other worker, with an error naming it and the fix."""
    import logging

    from conftest import two_workers

    caplog.set_level(logging.ERROR, logger="sluice")
    with two_workers(sluice_bin, tmp_path) as (a, b, token):
        loader = sluice.Loader(dataset=dataset, workers=[a.addr, b.addr], batch_size=8,
                               pipeline=PIPELINE, token_file=str(token), trust_cert=a.cert,
                               epochs=1)
        assert len(ids_of(loader.epoch(0))) == TOTAL
        del loader
        left = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
        assert left and b.addr in left[0] and "trust-cert" in left[0], left
        # Neither worker trusted: the epoch fails, naming the cause.
        other = tmp_path / "other.pem"
        other.write_text(open(b.cert).read())
        loader = sluice.Loader(dataset=dataset, workers=[a.addr], batch_size=8,
                               pipeline=PIPELINE, token_file=str(token), trust_cert=other)
        with pytest.raises(sluice.SluiceError, match="TLS"):
            next(iter(loader))


def test_a_workers_file_grows_and_shrinks_the_pool_mid_epoch(dataset, sluice_bin, tmp_path,
                                                             caplog):
    """The pool as a workers file that changes while the epoch runs, as an operator (or a
    script watching the cluster) edits it: a worker added mid-epoch gets units, one removed
    is drained, the logger says so, and the batches are those of decoding in process."""
    import logging
    import time

    from conftest import two_workers

    caplog.set_level(logging.INFO, logger="sluice")
    with two_workers(sluice_bin, tmp_path) as (a, b, token):
        trust = tmp_path / "trust.pem"
        trust.write_text(open(a.cert).read() + open(b.cert).read())
        pool = tmp_path / "workers"
        pool.write_text(f"# the pool\n{a.addr}\n")
        # Units of 10 samples, one after the other, started only 12 places ahead of the
        # consumer: the first worker cannot decode the epoch before the second joins.
        common = dict(dataset=dataset, batch_size=6, seed=5, pipeline=PIPELINE,
                      max_unit_samples=10, mix_units=1, mix_buffer=0, lookahead=12)
        want = ids_of(sluice.Loader(**common, threads=1).epoch(0))
        loader = sluice.Loader(**common, workers_file=pool, workers_refresh=0.05, epochs=1,
                               token_file=str(token), trust_cert=trust)
        got = []
        for n, (images, _) in enumerate(loader.epoch(0)):
            got.extend(images.ids)
            if n == 1:
                pool.write_text(f"{a.addr}\n{b.addr}\n")  # b joins
            if n == 8:
                pool.write_text(f"{b.addr}\n")  # a leaves: drained
            time.sleep(0.05)
        assert got == want, "the same batches whatever joined or left"
        stats = loader.stats()
        served = {name: samples for name, _, samples, _ in stats["workers"]}
        assert served.get(b.addr, 0) > 0, stats["workers"]
        assert stats["pool_changes"] == 2, stats
        said = " ".join(r.getMessage() for r in caplog.records)
        assert "joined the pool" in said and "left the pool" in said, said


def test_a_field_no_sample_has_is_an_error_once_64_samples_lack_it(dataset):
    loader = sluice.Loader(dataset=dataset, batch_size=8, pipeline=PIPELINE,
                           fields=["text", "cls"])
    epoch = loader.epoch(0)
    with pytest.raises(ValueError, match=r'fields: "text" is in none of the first 64 samples; '
                                         r'they have "cls", "jpg"'):
        for _ in range(8):
            next(epoch)


def served_bucket(dataset, root):
    """The dataset's shards (and .idx) copied into `root`/train with a manifest of relative
    URLs: what a storage node or a plain HTTP server serves."""
    import shutil

    src = pathlib.Path(dataset).parent
    bucket = root / "train"
    bucket.mkdir(parents=True)
    for f in src.glob("s-*"):
        shutil.copy(f, bucket / f.name)
    manifest = json.loads(pathlib.Path(dataset).read_text())
    for s in manifest["shards"]:
        s["url"] = pathlib.Path(s["url"]).name
    (bucket / "manifest.json").write_text(json.dumps(manifest))
    return bucket, manifest


def test_a_storage_node_down_for_seconds_mid_epoch_costs_a_pause(dataset, sluice_bin, tmp_path):
    """The only storage node is killed after the first batches and started again on the same
    port 5 s later: every unit that meets it down waits (refused connections are retried with
    backoff) and the epoch completes, each sample once."""
    import socket
    import time

    served_bucket(dataset, tmp_path / "store")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def start():
        proc = subprocess.Popen([sluice_bin, "storage", "--data", str(tmp_path / "store"),
                                 "--listen", f"127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return proc
            except OSError:
                time.sleep(0.05)
        raise AssertionError("sluice storage did not start")

    node = start()
    try:
        loader = sluice.Loader(dataset=f"http://127.0.0.1:{port}/v1/train/manifest.json",
                               batch_size=8, pipeline=PIPELINE, threads=1, epochs=1,
                               max_unit_samples=4)
        epoch = loader.epoch(0)
        ids = []
        for i, (images, _) in enumerate(epoch):
            ids.extend(images.ids)
            if i == 1:
                node.kill()
                node.wait()
                time.sleep(5)
                node = start()
        assert len(ids) == TOTAL and len(set(ids)) == TOTAL
    finally:
        node.kill()
        node.wait()


def test_a_stale_replica_listed_first_is_demoted_by_url(dataset, sluice_bin, tmp_path, caplog):
    """Two plain HTTP servers (what S3, nginx and MinIO are to a worker): the first replica of
    every shard holds another version of it, with its own consistent .idx. Every sample comes
    from the good replica, and the stale one is named once per shard's URL as demoted."""
    import functools
    import http.server
    import logging
    import threading

    caplog.set_level(logging.WARNING, logger="sluice")
    good, manifest = served_bucket(dataset, tmp_path / "good")
    # Another version of each shard under the same name: a different dataset, indexed.
    other = tmp_path / "other"
    subprocess.run([sluice_bin, "synth", "--output", str(other / "images"), "--classes", "3",
                    "--per-class", "30", "--seed", "99"], check=True, capture_output=True)
    stale = tmp_path / "stale" / "train"
    subprocess.run([sluice_bin, "shard", "--input", str(other / "images"), "--output",
                    str(stale / "s-%06d.tar"), "--max-count", "10"], check=True,
                   capture_output=True)
    servers = []
    for root in (stale, good):
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.RequestHandlerClass.log_message = lambda *a: None
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    try:
        bases = [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
        for s in manifest["shards"]:
            name = s["url"]
            s["url"] = f"{bases[0]}/{name}"
            s["replicas"] = [f"{bases[1]}/{name}"]
        path = tmp_path / "replicated.json"
        path.write_text(json.dumps(manifest))
        loader = sluice.Loader(dataset=str(path), batch_size=8, pipeline=PIPELINE, epochs=1)
        keys = [k for images, _ in loader.epoch(0) for k in images.keys]
        reference = [k for images, _ in sluice.Loader(dataset=dataset, batch_size=8,
                                                      pipeline=PIPELINE, epochs=1).epoch(0)
                     for k in images.keys]
        assert keys == reference, "every sample from the good replica, in the same order"
        demoted = [r.getMessage() for r in caplog.records if "demoted" in r.getMessage()]
        assert demoted and all(bases[0] in d for d in demoted), demoted
        assert any("describes a different shard" in d for d in demoted), demoted
    finally:
        for s in servers:
            s.shutdown()


def test_an_epoch_keeps_its_loader_alive(dataset):
    """`for ... in sluice.Loader(...).epoch(0)`: the loader is a temporary, its epoch is not."""
    import gc

    epoch = sluice.Loader(dataset=dataset, batch_size=8, pipeline=PIPELINE, epochs=1).epoch(0)
    gc.collect()
    assert len(ids_of(epoch)) == TOTAL


def test_shards_and_indexes_rewritten_under_a_running_job_deliver_no_foreign_sample(
        dataset, sluice_bin, tmp_path):
    """Re-running `sluice shard` into the dataset's own folder (new .tar and new .idx under
    the same names) while an epoch is read, in process from shared paths: samples already
    read are the old ones; every later one is the old version's or skipped as changed,
    never a new sample under an old id."""
    import shutil

    folder = tmp_path / "live"
    shutil.copytree(pathlib.Path(dataset).parent, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    for s in manifest["shards"]:
        s["url"] = str(folder / pathlib.Path(s["url"]).name)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    old_keys = set()
    for images, _ in sluice.Loader(dataset=str(folder / "manifest.json"), batch_size=8,
                                   pipeline=PIPELINE, epochs=1).epoch(0):
        old_keys.update(images.keys)
    other = tmp_path / "other"
    subprocess.run([sluice_bin, "synth", "--output", str(other), "--classes", "3",
                    "--per-class", "30", "--seed", "7"], check=True, capture_output=True)
    loader = sluice.Loader(dataset=str(folder / "manifest.json"), batch_size=8,
                           pipeline=PIPELINE, epochs=1, threads=1, max_unit_samples=4,
                           prefetch_next_epoch=False)
    delivered, skipped = [], []
    for i, (images, _) in enumerate(loader.epoch(0)):
        delivered += images.keys
        skipped += [why for _, why in images.skipped]
        if i == 1:
            subprocess.run([sluice_bin, "shard", "--input", str(other), "--output",
                            str(folder / "s-%06d.tar"), "--max-count", "10"], check=True,
                           capture_output=True)
    assert set(delivered) <= old_keys, "a new sample was delivered under an old id"
    assert len(delivered) + len(skipped) == TOTAL
    # Each skip is named: changed since indexed, a checksum, a sample off its indexed range,
    # or a header that a range read found in the middle of the new file.
    assert skipped and all(why for why in skipped), skipped


def test_a_mistyped_argument_is_a_value_error_naming_it_and_the_config_is_readable(dataset):
    with pytest.raises(ValueError, match=r"^batch_size: invalid type: string"):
        sluice.Loader(dataset=dataset, pipeline=PIPELINE, batch_size="eight")
    with pytest.raises(ValueError, match=r"^mixing.window_units: invalid value: integer `-1`"):
        sluice.Loader(dataset=dataset, pipeline=PIPELINE, mix_units=-1)
    loader = sluice.Loader(dataset=dataset, pipeline=PIPELINE, batch_size=8, drop_last=True,
                           shuffle="partial:0.25", label=None, worker_wait=5)
    config = loader.config
    assert (config["batch_size"], config["last_batch"], config["shuffle"]) == \
        (8, "drop", "partial:0.25")
    assert config["label"] is None and config["worker_wait"] == 5.0
    assert config["lookahead"] == 512, "a default that follows from others is settled"


def test_rank_and_world_come_from_the_environment_and_explicit_arguments_win(dataset,
                                                                             monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = sluice.Loader(dataset=dataset, pipeline=PIPELINE, batch_size=8)
    assert (loader.dataset_identity["rank"], loader.dataset_identity["world_size"]) == (1, 3)
    loader = sluice.Loader(dataset=dataset, pipeline=PIPELINE, batch_size=8, rank=0,
                           world_size=2)
    assert (loader.dataset_identity["rank"], loader.dataset_identity["world_size"]) == (0, 2)
    monkeypatch.setenv("WORLD_SIZE", "three")
    with pytest.raises(ValueError, match="WORLD_SIZE='three' is not a number"):
        sluice.Loader(dataset=dataset, pipeline=PIPELINE, batch_size=8)


def test_an_empty_sluice_token_is_refused_by_name(dataset, monkeypatch, tmp_path):
    monkeypatch.setenv("SLUICE_TOKEN", "  ")
    cert = tmp_path / "cert.pem"
    cert.write_text("")
    with pytest.raises(ValueError, match="SLUICE_TOKEN is empty"):
        sluice.Loader(dataset=dataset, pipeline=PIPELINE, workers=["127.0.0.1:1"],
                      trust_cert=str(cert))


def test_breaks_and_dropped_loaders_log_no_error(dataset, worker, caplog):
    """Leaving an epoch early (``break``) or dropping a loader mid-epoch is a user's normal
    move: the links it takes down are no error, so nothing is logged at ERROR."""
    import logging

    caplog.set_level(logging.DEBUG, logger="sluice")
    loader = sluice.Loader(dataset=dataset, workers=[worker.addr], batch_size=8,
                           pipeline=PIPELINE, token_file=worker.token_file,
                           trust_cert=worker.cert)
    for epoch in range(100):
        for i, _ in enumerate(loader.epoch(epoch)):
            if i == epoch % 3:
                break
    for job in range(50):
        dropped = sluice.Loader(dataset=dataset, workers=[worker.addr], batch_size=8,
                                pipeline=PIPELINE, token_file=worker.token_file,
                                trust_cert=worker.cert, job_name=f"dropped-{job}")
        next(iter(dropped))
        del dropped
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], errors


def test_serve_metrics_shows_the_clients_counters_for_prometheus(dataset):
    """sluice.serve_metrics() serves the training process's client metrics: every counter
    from the start, and the batches an epoch handed out."""
    import urllib.request

    addr = sluice.serve_metrics("127.0.0.1:0")
    assert sluice.serve_metrics.__doc__ and "Prometheus" in sluice.serve_metrics.__doc__
    loader = sluice.Loader(dataset, batch_size=8, pipeline="decode | resize 32 | center_crop 32")
    batches = sum(1 for _ in loader.epoch(0))
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=10).read().decode()
    counted = [float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("sluice_client_batches_total")]
    assert counted and counted[0] >= batches, text
    assert "sluice_client_reassigned_units_total" in text
    with pytest.raises(ValueError, match="serve_metrics"):
        sluice.serve_metrics("not an address")
