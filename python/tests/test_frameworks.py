"""Multi-process jobs as teams run them, each rank a real process on gloo: Lightning's DDP with
its default launcher, Accelerate under torchrun, and plain torch.distributed. They checkpoint
with nothing but their own machinery (which stores rank 0's loader state only) and resume mid
epoch, at the same world size and at another; the training steps' keys, written by every rank,
must cover the epoch exactly once. Needs torch, Lightning and Accelerate (CI's torch venv has
them); each test skips with a message without them."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, synth_manifest

torch = pytest.importorskip("torch", reason="torch is not installed")

PIPELINE = "decode | resize 40 | center_crop 32"
TOTAL = 90

EXAMPLES = ROOT / "examples"

# A loader built at the top of a Lightning script, before Lightning's launcher starts the
# other ranks and the process group (the launcher sets no RANK), with no rank arguments.
LIGHTNING_TOP_SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch
    import lightning as L
    import sluice.torch as st

    out, manifest = sys.argv[1:3]

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(3 * 32 * 32, 3)
            self.seen = []

        def training_step(self, batch, i):
            self.seen.append([self.trainer.current_epoch, list(batch["__key__"])])
            x = batch["image"].float().flatten(1) / 255
            return torch.nn.functional.cross_entropy(self.net(x), batch["label"])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    loader = st.Loader(manifest, batch_size=8, pipeline="%(pipeline)s", seed=7)
    model = Tiny()
    trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=2, max_epochs=2,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=out)
    trainer.fit(model, train_dataloaders=loader)
    with open(os.path.join(out, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump(model.seen, f)
    torch.distributed.destroy_process_group()
''') % {"pipeline": PIPELINE}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra):
    """The test's environment without a launcher's variables, so each job starts as a user's
    would, from a shell."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT", "NODE_RANK")}
    env.update({"PYTHONUNBUFFERED": "1", **extra})
    return env


def run(cmd, env, cwd, timeout=300):
    p = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} exited {p.returncode}:\n{p.stdout[-6000:]}"
    return p.stdout


def lightning_job(tmp_path, name, devices, manifest, *args):
    """examples/lightning_train.py on `devices` CPU ranks: the keys each rank trained on."""
    pytest.importorskip("lightning", reason="Lightning is not installed")
    out = tmp_path / name
    cmd = [sys.executable, str(EXAMPLES / "lightning_train.py"), "--dataset", str(manifest),
           "--devices", str(devices), "--size", "32", "--classes", "3",
           "--checkpoint-dir", str(tmp_path / "ckpt"), "--keys-out", str(out), *args]
    run(cmd, clean_env(MASTER_PORT=str(free_port())), tmp_path)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(devices)]


@pytest.fixture(scope="module")
def evalset(sluice_bin, tmp_path_factory):
    """85 generated JPEGs, 10 per shard: 2 ranks read 43 each, one of them a padded repeat."""
    return synth_manifest(sluice_bin, tmp_path_factory.mktemp("eval"), 5, 17, "e", seed=5)


def evaluated(tmp_path, name, devices):
    """What each evaluation loop of a lightning_job saw on every rank: {(loop, epoch): [(key,
    padding)]}."""
    seen = {}
    for r in range(devices):
        for loop, epoch, ks, padding in json.loads(
                (tmp_path / name / f"rank{r}-eval.json").read_text()):
            seen.setdefault((loop, epoch), []).extend(zip(ks, padding))
    return seen


def keys(steps):
    """The keys of these training steps: Lightning's are [epoch, keys], Accelerate's keys."""
    return [k for step in steps for k in (step[1] if isinstance(step[0], int) else step)]


def assert_exactly_once(parts):
    every = [k for part in parts for k in part]
    assert len(every) == TOTAL and len(set(every)) == TOTAL, (
        f"{len(every)} keys, {len(set(every))} distinct: not the epoch exactly once")


def test_lightning_ddp_resumes_its_own_mid_epoch_checkpoint_on_every_rank(dataset, tmp_path):
    """examples/lightning_train.py: ModelCheckpoint (rank 0's loader state) after step 3, the
    job stopped after step 5, then fit(ckpt_path=): every rank goes on in its own order, and
    each sample of the epoch is trained on exactly once. (At a larger world size Lightning
    caps the epoch at the len() it read before loading the state: the loader warns, see
    test_torch.py; Accelerate resumes at 3 below.)"""
    stopped = lightning_job(tmp_path, "stop", 2, dataset, "--every-n-steps", "3",
                            "--stop-after", "5")
    assert [len(s) for s in stopped] == [5, 5]
    ckpt = tmp_path / "ckpt" / "step=3.ckpt"
    assert ckpt.exists(), sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    before = [keys(s[:3]) for s in stopped]
    rest = lightning_job(tmp_path, "resume", 2, dataset, "--resume", str(ckpt))
    assert_exactly_once(before + [keys(r) for r in rest])
    for r in range(2):
        assert rest[r][:2] == stopped[r][3:5], f"rank {r} did not go on in its own order"


def test_lightning_runs_every_loop_at_two_ranks_and_resumes_an_epoch_end_checkpoint(
        dataset, evalset, tmp_path):
    """examples/lightning_train.py with validation in fit(), then validate, test and predict,
    all at 2 DDP ranks: every loop scores each sample of the 85 once (the 86th row is marked
    padding). Lightning's default checkpoint at epoch 0's end, resumed with fit(ckpt_path=),
    trains epoch 1 on every rank in the uninterrupted job's order."""
    full = lightning_job(tmp_path, "full", 2, dataset, "--epochs", "2", "--classes", "5",
                         "--eval-dataset", evalset, "--after-fit", "validate,test,predict", "--epoch-checkpoints")
    seen = evaluated(tmp_path, "full", 2)
    assert sorted(seen) == [("predict", 2), ("test", 2), ("validate", 0), ("validate", 1),
                            ("validate", 2)], sorted(seen)
    for loop, rows in seen.items():
        real = [k for k, padded in rows if not padded]
        assert len(real) == 85 and len(set(real)) == 85, f"{loop}: each sample once"
        assert len(rows) == 86, f"{loop}: {len(rows)} rows, one padded repeat expected"
    ckpt = tmp_path / "ckpt" / "epoch=0.ckpt"
    assert ckpt.exists(), sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    resumed = lightning_job(tmp_path, "resumed", 2, dataset, "--epochs", "2", "--classes", "5",
                            "--eval-dataset", evalset, "--resume", str(ckpt))
    for r in range(2):
        assert resumed[r] == [s for s in full[r] if s[0] == 1], \
            f"rank {r}: the resumed epoch 1 is not the uninterrupted job's"
    real = [k for k, padded in evaluated(tmp_path, "resumed", 2)[("validate", 1)] if not padded]
    assert sorted(real) == sorted(set(real)) and len(real) == 85


def test_lightning_default_launcher_needs_no_rank_arguments(dataset, tmp_path):
    """Trainer(strategy="ddp", devices=2) starts rank 1 itself and sets no RANK: a loader
    built at the top of the script, before the process group, takes the ranks from
    torch.distributed when Lightning first asks for its length; 2 epochs, each exactly once
    across the ranks, in different orders."""
    pytest.importorskip("lightning", reason="Lightning is not installed")
    script = tmp_path / "top.py"
    script.write_text(LIGHTNING_TOP_SCRIPT)
    run([sys.executable, str(script), str(tmp_path), str(dataset)],
        clean_env(MASTER_PORT=str(free_port())), tmp_path)
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for epoch in (0, 1):
        assert_exactly_once([keys([s for s in ranks if s[0] == epoch]) for ranks in seen])
    orders = [[k for s in seen[0] if s[0] == e for k in s[1]] for e in (0, 1)]
    assert orders[0] != orders[1], "epoch 1 repeated epoch 0's order"


def accelerate_job(tmp_path, name, ranks, manifest, *args, launcher="torchrun"):
    """examples/accelerate_train.py on CPU ranks, under torchrun or `accelerate launch
    --multi_gpu` (the docs' recipe): the keys each rank trained on."""
    pytest.importorskip("accelerate", reason="Accelerate is not installed")
    out = tmp_path / name
    port = str(free_port())
    launch = {
        "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                     str(ranks), "--master_addr", "127.0.0.1", "--master_port", port],
        "accelerate": [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
                       "--num_processes", str(ranks), "--main_process_port", port],
    }[launcher]
    cmd = [*launch,
           str(EXAMPLES / "accelerate_train.py"), "--dataset", str(manifest), "--size", "32",
           "--classes", "3", "--state-dir", str(tmp_path / "state"), "--keys-out", str(out),
           *args]
    # CPU ranks, as the Lightning jobs: on a host with fewer GPUs than ranks, Accelerate would
    # still put a rank on a GPU that is not there ("invalid device ordinal").
    run(cmd, clean_env(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""), tmp_path)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def test_accelerate_save_state_resumes_every_rank_under_torchrun(dataset, tmp_path):
    """examples/accelerate_train.py: save_state after the third step (rank 0 writes the
    loader's state), the job stopped after the fifth, then load_state in a new job: at 2
    ranks each goes on in its own order; at 3 the rest is split; each sample once. The first
    job starts as the docs say, `accelerate launch --multi_gpu --num_processes 2` (two
    processes on a CPU machine too), the others under torchrun."""
    stopped = accelerate_job(tmp_path, "stop", 2, dataset, "--save-at", "3", "--stop-after", "5",
                             launcher="accelerate")
    before = [keys(s[:3]) for s in stopped]
    rest = accelerate_job(tmp_path, "resume2", 2, dataset, "--resume")
    assert_exactly_once(before + [keys(r) for r in rest])
    for r in range(2):
        assert rest[r][:2] == stopped[r][3:5], f"rank {r} did not go on in its own order"
    rest3 = accelerate_job(tmp_path, "resume3", 3, dataset, "--resume")
    assert_exactly_once(before + [keys(r) for r in rest3])
    assert len({len(r) for r in rest3}) == 1, "the ranks took different numbers of steps"


RANK_SCRIPT = textwrap.dedent('''
    import json, sys
    import torch.distributed as dist
    import sluice.torch as st
    dist.init_process_group("gloo")
    kwargs = json.loads(sys.argv[2])[dist.get_rank()]
    try:
        loader = st.Loader(sys.argv[1], pipeline="%(pipeline)s", **kwargs)
        print("OK", loader._loader().dataset_identity["rank"], len(loader))
    except ValueError as e:
        print("REFUSED", e)
        sys.exit(3)
    finally:
        dist.destroy_process_group()
''') % {"pipeline": PIPELINE}


def run_ranks(manifest, per_rank, tmp_path):
    """One process per entry of `per_rank` (its Loader arguments), as torchrun starts them but
    without LOCAL_WORLD_SIZE or RANK-less surprises: [(exit code, output)]."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = str(free_port())
    procs = []
    for rank in range(len(per_rank)):
        env = clean_env(RANK=str(rank), WORLD_SIZE=str(len(per_rank)), MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, str(script), str(manifest),
                                       json.dumps(per_rank)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return [(p.wait(timeout=120), p.stdout.read()) for p in procs]


@pytest.mark.parametrize("mine, theirs, named", [
    ({"seed": 1}, {"seed": 2}, "differ on seed: 1 and 2"),
    ({"batch_size": 8}, {"batch_size": 16}, "differ on batch_size: 8 and 16"),
    ({"shuffle": "global"}, {"shuffle": "local"}, "differ on shuffle"),
    ({"drop_last": False}, {"drop_last": True}, "differ on drop_last"),
    ({"rank": 0, "world_size": 2}, {"rank": 0, "world_size": 2}, "ranks [1] are read by none"),
])
def test_ranks_that_disagree_all_refuse_before_the_first_batch(dataset, tmp_path, mine, theirs,
                                                               named):
    for code, out in run_ranks(dataset, [mine, theirs], tmp_path):
        assert code == 3, out
        assert named in out, out


def test_ranks_that_agree_take_their_rank_from_torch_distributed(dataset, tmp_path):
    results = run_ranks(dataset, [{"batch_size": 8}, {"batch_size": 8}], tmp_path)
    assert [out.split()[:3] for _, out in results] == [["OK", "0", "6"], ["OK", "1", "6"]], \
        results


def trainer_job(tmp_path, name, manifest, evalset, *args):
    """examples/trainer_train.py (sluice.transformers.Trainer) on 2 CPU ranks under torchrun:
    what each rank trained and evaluated on."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    out = tmp_path / name
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           str(EXAMPLES / "trainer_train.py"), "--dataset", str(manifest), "--eval-dataset",
           str(evalset), "--classes", "5", "--output-dir", str(tmp_path / "trainer"),
           "--keys-out", str(out), *args]
    run(cmd, clean_env(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""), tmp_path)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_transformers_trainer_trains_evaluates_and_resumes_its_own_checkpoint(dataset, evalset,
                                                                               tmp_path):
    """Trainer saves checkpoint-3 (its own files and the loader's state) and is stopped after
    step 5; train(resume_from_checkpoint=True) goes on with each rank's own next batches, the
    epoch exactly once across the ranks; evaluate() scores each of the 85 samples once."""
    stopped = trainer_job(tmp_path, "stop", dataset, evalset, "--save-steps", "3",
                          "--stop-after", "5")
    assert (tmp_path / "trainer" / "checkpoint-3" / "sluice_loader.json").exists()
    resumed = trainer_job(tmp_path, "resume", dataset, evalset, "--resume")
    for r in range(2):
        assert resumed[r]["trained"][:2] == stopped[r]["trained"][3:5], \
            f"rank {r} did not go on in its own order"
    assert_exactly_once([keys(stopped[r]["trained"][:3] + resumed[r]["trained"])
                         for r in range(2)])
    rows = [(k, p) for r in range(2) for ks, ps in resumed[r]["evaluated"]
            for k, p in zip(ks, ps)]
    real = [k for k, padded in rows if not padded]
    assert len(rows) == 86 and len(real) == 85 and len(set(real)) == 85
