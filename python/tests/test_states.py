"""Checkpoints as StatefulDataLoader's users take them (torchdata's own state tests, written for
sluice.torch): a state taken between batches, inside the loop after the last batch, after the
loop, before the first ``iter()``, or just after a load resumes exactly what an uninterrupted
loader would have given next, on a new loader and on one that has moved on, for a single
dataset and for a mixture. Compared batch by batch with uninterrupted runs of the same seed."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import sluice.torch as st  # noqa: E402

PIPELINE = "decode | resize 32 | center_crop 32"


@pytest.fixture(params=["single", "mixture"])
def make(request, dataset, small):
    """Builds a loader of the kind under test: 90 samples (12 batches of 8, the last of 2), or
    a 3:1 mixture of 120 (15 batches)."""
    data = dataset if request.param == "single" else [(dataset, 3), (small, 1)]

    def build():
        return st.Loader(data, batch_size=8, pipeline=PIPELINE, seed=11)

    return build


def ids(batch):
    """A batch's samples, each as (source, key)."""
    sources = batch.get("__source__", torch.zeros(len(batch["__key__"]), dtype=torch.int64))
    return [(int(s), k) for s, k in zip(sources, batch["__key__"])]


def epochs(loader, n):
    """The next `n` epochs of plain iteration, each a list of batches."""
    return [[ids(b) for b in loader] for _ in range(n)]


@pytest.fixture
def reference(make):
    """Epochs 0, 1 and 2 of an uninterrupted loader."""
    return epochs(make(), 3)


@pytest.mark.parametrize("at", [1, 5, -2])
def test_a_state_between_batches_resumes_the_rest_then_the_next_epoch(make, reference, at):
    loader = make()
    it = iter(loader)
    taken = [ids(next(it)) for _ in range(at % len(reference[0]))]
    state = loader.state_dict()
    del it
    again = make()
    again.load_state_dict(state)
    rest, after = epochs(again, 2)
    assert taken + rest == reference[0]
    assert after == reference[1]


def test_a_state_at_an_epoch_s_end_resumes_at_the_next_epoch(make, reference):
    """Inside the loop once the last batch is out (what Lightning saves: it counts batches and
    never asks for the one after the last), and after the loop: both give the next epoch, on a
    new loader and on one that had moved on into the middle of another epoch."""
    loader = make()
    for batch in loader:
        inside = loader.state_dict()
    after_loop = loader.state_dict()
    for state in (inside, after_loop):
        fresh = make()
        fresh.load_state_dict(state)
        assert epochs(fresh, 2) == reference[1:3]
        moved = make()
        it = iter(moved)
        next(it), next(it)
        moved.load_state_dict(state)
        assert epochs(moved, 1) == reference[1:2]


def test_the_state_before_the_first_iter_restarts_any_loader(make, reference):
    initial = make().state_dict()
    read_some = make()
    it = iter(read_some)
    next(it), next(it)
    read_some.load_state_dict(initial)
    assert epochs(read_some, 2) == reference[0:2]
    # A loader that had loaded a later checkpoint (a mixture's sources known from there on).
    later = make()
    epochs(later, 1)
    resumed = make()
    resumed.load_state_dict(later.state_dict())
    next(iter(resumed))
    resumed.load_state_dict(initial)
    assert epochs(resumed, 1) == reference[0:1]


def test_a_state_saved_right_after_a_load_is_the_state_loaded(make, reference):
    loader = make()
    initial = loader.state_dict()
    it = iter(loader)
    next(it), next(it), next(it)
    mid = loader.state_dict()
    del it
    for state in (initial, mid):
        other = make()
        next(iter(other))
        other.load_state_dict(state)
        assert other.state_dict() == state
    other = make()
    other.load_state_dict(mid)
    again = make()
    again.load_state_dict(other.state_dict())
    assert [ids(b) for b in again] == reference[0][3:]


def test_two_epochs_then_a_state_resume_the_third_and_fourth(make, reference):
    loader = make()
    epochs(loader, 2)
    state = loader.state_dict()
    again = make()
    again.load_state_dict(state)
    assert epochs(again, 1) == reference[2:3]
