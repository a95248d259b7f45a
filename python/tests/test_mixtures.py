"""Mixtures as a user writes them: ``dataset=[("a.json", 3), ("b.json", 1)]`` or a mixture
file, each sample's source in ``images.source``, and a checkpoint resumed with new weights."""

import collections

import pytest

import sluice

PIPELINE = "decode | resize 32 | center_crop 32"


def read(loader, epoch):
    """Each sample of ``epoch`` as (source, key), in delivery order."""
    out = []
    for images, _ in loader.epoch(epoch):
        out.extend(zip(images.source, images.keys))
    return out


def test_weights_hold_and_the_small_source_is_upsampled(dataset, small):
    loader = sluice.Loader([(dataset, 3), (small, 1)], batch_size=16, seed=2, pipeline=PIPELINE)
    assert loader.sources == [dataset, small]
    # 120 samples an epoch: 90 of the first source, 30 of the second, at 3:1.
    epoch = loader.epoch(0)
    samples = []
    for images, _ in epoch:
        samples.extend(zip(images.source, images.keys))
    counts = collections.Counter(s for s, _ in samples)
    assert counts == {0: 90, 1: 30}
    assert epoch.report()["per_source"] == [90, 30]
    for i in range(0, len(samples) - 63, 64):
        window = [s for s, _ in samples[i:i + 64]]
        assert abs(window.count(0) / 64 - 0.75) <= 0.10
    # The same seed, the same batches; a mixture file says the same as the list.
    assert read(sluice.Loader([(dataset, 3), (small, 1)], batch_size=16, seed=2,
                              pipeline=PIPELINE), 0) == samples


def test_a_mixture_file_is_a_dataset(dataset, small, tmp_path):
    mix = tmp_path / "mix.toml"
    mix.write_text(f'[[sources]]\ndataset = "{dataset}"\nweight = 1\n\n'
                   f'[[sources]]\ndataset = "{small}"\nweight = 1\n')
    from_file = sluice.Loader(str(mix), batch_size=16, seed=2, pipeline=PIPELINE)
    from_list = sluice.Loader([(dataset, 1), (small, 1)], batch_size=16, seed=2,
                              pipeline=PIPELINE)
    a = read(from_file, 0)
    assert a == read(from_list, 0)
    # 1:1 of 120 samples: the 30-sample source comes twice, pass after pass.
    keys = collections.Counter(k for s, k in a if s == 1)
    assert len(keys) == 30 and set(keys.values()) == {2}


def test_a_checkpoint_resumed_with_new_weights_continues_each_pass(dataset, small):
    old = sluice.Loader([(dataset, 3), (small, 1)], batch_size=8, seed=4, pipeline=PIPELINE)
    before = []
    for i, (images, _) in enumerate(old.epoch(0)):
        before.extend(zip(images.source, images.keys))
        if i == 4:
            state = old.state_dict()
            break
    new = sluice.Loader([(dataset, 1), (small, 1)], batch_size=8, seed=4, pipeline=PIPELINE)
    new.load_state_dict(state)
    after = read(new, 0)
    assert len(before) + len(after) == 120
    share = sum(1 for s, _ in after if s == 0) / len(after)
    assert abs(share - 0.5) <= 0.03, share
    # The large source's pass goes on: none of its samples comes twice.
    first = [k for s, k in before + after if s == 0]
    assert len(first) == len(set(first))


def test_mixture_mistakes_name_the_argument(dataset, small):
    with pytest.raises(ValueError, match="dataset: expected"):
        sluice.Loader([(dataset,)], pipeline=PIPELINE)
    with pytest.raises(ValueError, match="weights"):
        sluice.Loader([(dataset, -1), (small, 1)], pipeline=PIPELINE)
    with pytest.raises(ValueError, match="shuffle"):
        sluice.Loader([(dataset, 1), (small, 1)], shuffle="local", pipeline=PIPELINE)
    with pytest.raises(ValueError, match="epoch_samples"):
        sluice.Loader(dataset, epoch_samples=10, pipeline=PIPELINE)


def test_torch_batches_carry_each_sample_s_source(dataset, small):
    torch = pytest.importorskip("torch")
    import sluice.torch as st

    loader = st.Loader([(dataset, 3), (small, 1)], batch_size=16, seed=2, pipeline=PIPELINE)
    sources = torch.cat([b["__source__"] for b in loader])
    assert sources.dtype == torch.int64
    assert int((sources == 1).sum()) == 30


def test_a_tampered_mixture_checkpoint_is_a_value_error_never_a_panic(dataset, small):
    """A state edited by hand or cut short names what is wrong as a ``ValueError``; nothing
    surfaces as a Rust panic (a ``BaseException`` that ``except Exception`` lets through)."""
    import copy

    def fresh():
        return sluice.Loader([(dataset, 3), (small, 1)], batch_size=8, seed=4,
                             pipeline=PIPELINE)

    old = fresh()
    for i, _ in enumerate(old.epoch(0)):
        if i == 2:
            state = old.state_dict()
            break
    edits = {
        "one weight for two sources": lambda s: s["mixture"].update(weights=[7]),
        "weights all zero": lambda s: s["mixture"].update(weights=[0, 0]),
        "one source state for two": lambda s: s["mixture"].update(state=s["mixture"]["state"][:1]),
        "an earlier segment's weights": lambda s: s.update(
            resumed=[{"world_size": 2, "batches": 1, "weights": [5]}]),
    }
    for what, edit in edits.items():
        tampered = copy.deepcopy(state)
        edit(tampered)
        loader = fresh()
        try:
            loader.load_state_dict(tampered)
            list(loader.epoch(tampered["epoch"]))
        except ValueError as e:
            assert "checkpoint" in str(e) or "mixture" in str(e), (what, e)
            continue
        pytest.fail(f"{what}: the tampered state was accepted")


def test_a_resume_at_another_world_size_says_what_its_rounding_leaves_out(dataset, small,
                                                                          caplog):
    """120 samples at 2 ranks, one batch of 8 each read: 104 left, shared by 3 ranks as 34
    each; the 2 left out of the epoch are logged, not lost in silence."""
    mix = [(dataset, 3), (small, 1)]
    old = sluice.Loader(mix, batch_size=8, seed=4, pipeline=PIPELINE, rank=0, world_size=2)
    stream = old.epoch(0)
    next(iter(stream))
    state = old.state_dict()
    new = sluice.Loader(mix, batch_size=8, seed=4, pipeline=PIPELINE, rank=0, world_size=3)
    with caplog.at_level("INFO", logger="sluice"):
        new.load_state_dict(state)
    said = [r.getMessage() for r in caplog.records if "resumed at world_size 3" in r.getMessage()]
    assert said and "of the 104 samples left, 102 are read and 2 are left out" in said[0], \
        caplog.text
    assert len(read(new, 0)) == 34


SCHEDULE = [(2, [0.9, 0.1]), (12, [0.25, 0.75])]


def scheduled_share(step):
    """Source 0's share at `step`: 0.9 to step 2, a line to 0.25 at step 12, then 0.25."""
    if step <= 2:
        return 0.9
    if step >= 12:
        return 0.25
    return 0.9 - 0.65 * (step - 2) / 10


def batches(loader, epoch):
    return [list(zip(images.source, images.keys)) for images, _ in loader.epoch(epoch)]


def test_a_weight_schedule_sets_each_batch_and_a_resume_keeps_it(dataset, small):
    """A linear schedule at 1 rank, 15 batches of 8 an epoch: each batch holds source 0 at
    its step's share (±1 sample). A state after batch 5 resumes the uninterrupted run's
    batches at 1 rank; at 3 ranks (a state of a 2-rank job) the schedule's shares go on from
    the step it was taken at, and each pass stays whole."""
    mix = [(dataset, 1), (small, 1)]

    def loader(**kw):
        return sluice.Loader(mix, batch_size=8, seed=6, pipeline=PIPELINE,
                             weight_schedule=SCHEDULE, schedule_interpolate="linear", **kw)

    whole = batches(loader(), 0)
    assert len(whole) == 15
    for step, batch in enumerate(whole[:-1]):
        got = sum(1 for s, _ in batch if s == 0)
        assert abs(got - 8 * scheduled_share(step)) <= 1.01, (step, got)
    # The same world: exactly the uninterrupted batches.
    first = loader()
    stream = first.epoch(0)
    for _ in range(5):
        next(stream)
    state = first.state_dict()
    del stream
    again = loader()
    again.load_state_dict(state)
    assert batches(again, 0) == whole[5:]
    # A 2-rank job stopped after step 4, resumed at 3 ranks.
    two = [loader(rank=r, world_size=2) for r in range(2)]
    streams = [t.epoch(0) for t in two]
    before = [list(zip(i.source, i.keys)) for s in streams for _ in range(4)
              for i, _ in [next(s)]]
    state = two[0].state_dict()
    del streams
    three = [loader(rank=r, world_size=3) for r in range(3)]
    for t in three:
        t.load_state_dict(state)
    after = [batches(t, 0) for t in three]
    assert len({len(a) for a in after}) == 1
    for k in range(len(after[0]) - 1):
        step = [x for a in after for x in a[k]]
        got = sum(1 for s, _ in step if s == 0)
        assert abs(got - len(step) * scheduled_share(4 + k)) <= 3.01, (4 + k, got, len(step))
    delivered = [x for b in before for x in b] + [x for a in after for b in a for x in b]
    for source, size in ((0, 90), (1, 30)):
        # Each pass whole: a sample comes again only once every other has come as often.
        seen = collections.Counter(k for s, k in delivered if s == source)
        total = sum(seen.values())
        assert len(seen) == min(total, size), f"source {source}: a sample came twice early"
        assert max(seen.values()) - min(seen.values()) <= 1, f"source {source}: {seen}"


def test_a_mixture_file_gives_a_schedule_and_mistakes_are_named(dataset, small, tmp_path):
    mix = tmp_path / "sched.toml"
    mix.write_text(f'[[sources]]\ndataset = "{dataset}"\nweight = 1\n\n'
                   f'[[sources]]\ndataset = "{small}"\nweight = 1\n\n'
                   '[schedule]\ninterpolate = "linear"\n'
                   'points = [{ step = 2, weights = [0.9, 0.1] }, '
                   '{ step = 12, weights = [0.25, 0.75] }]\n')
    from_file = sluice.Loader(str(mix), batch_size=8, seed=6, pipeline=PIPELINE)
    from_args = sluice.Loader([(dataset, 1), (small, 1)], batch_size=8, seed=6,
                              pipeline=PIPELINE, weight_schedule=SCHEDULE,
                              schedule_interpolate="linear")
    assert batches(from_file, 0) == batches(from_args, 0)
    with pytest.raises(ValueError, match=r"point 1 .*1 weights for 2 sources"):
        sluice.Loader([(dataset, 1), (small, 1)], pipeline=PIPELINE,
                      weight_schedule=[(0, [1, 1]), (5, [1])])
    with pytest.raises(ValueError, match="not after point 0"):
        sluice.Loader([(dataset, 1), (small, 1)], pipeline=PIPELINE,
                      weight_schedule=[(5, [1, 1]), (5, [1, 0])])
    with pytest.raises(ValueError, match="weight_schedule.*mixture"):
        sluice.Loader(dataset, pipeline=PIPELINE, weight_schedule=[(0, [1.0])])
    with pytest.raises(ValueError, match="schedule_interpolate"):
        sluice.Loader([(dataset, 1), (small, 1)], pipeline=PIPELINE,
                      weight_schedule=SCHEDULE, schedule_interpolate="cubic")


def test_an_epoch_in_rounds_keeps_its_schedule_length_and_checkpoints(dataset, small):
    """The scheduled epoch above read in rounds of 2 batches (``mixture_round_samples=16``):
    the same length, each batch at its step's share, and a state taken in the middle of a
    round or at a round's end resumes the uninterrupted batches."""
    mix = [(dataset, 1), (small, 1)]

    def loader():
        return sluice.Loader(mix, batch_size=8, seed=6, pipeline=PIPELINE,
                             weight_schedule=SCHEDULE, schedule_interpolate="linear",
                             mixture_round_samples=16)

    whole = batches(loader(), 0)
    assert len(whole) == len(loader()) == 15
    for step, batch in enumerate(whole[:-1]):
        got = sum(1 for s, _ in batch if s == 0)
        assert abs(got - 8 * scheduled_share(step)) <= 1.01, (step, got)
    for taken in (5, 6):
        first = loader()
        stream = first.epoch(0)
        for _ in range(taken):
            next(stream)
        state = first.state_dict()
        del stream
        again = loader()
        again.load_state_dict(state)
        assert len(again) == 15
        assert batches(again, 0) == whole[taken:], taken
    with pytest.raises(ValueError, match="mixture_round_samples"):
        sluice.Loader(mix, pipeline=PIPELINE, mixture_round_samples=0)
    # Past what the process may allocate: a ValueError with the limit, not an abort that
    # takes the interpreter down.
    with pytest.raises(ValueError, match="mixture_round_samples.*16777216"):
        sluice.Loader(mix, pipeline=PIPELINE, mixture_round_samples=2**40,
                      epoch_samples=10**12)
