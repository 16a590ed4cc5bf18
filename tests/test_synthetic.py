"""The synthetic dataset (`--dataset synthetic:C,H,W:K[:N]`): shape, determinism, batches gathered on the device,
and a training run on it (CPU here; the same path runs on a GPU in tests/test_cuda.py)."""

import pytest
import torch

from cptsim.data import DataInfo, SyntheticDataset, dataset_info, load_datasets, parse_synthetic
from cptsim.errors import InputError


def test_synthetic_name_gives_shape_classes_and_sizes_without_loading():
    assert dataset_info("synthetic:3,32,32:10:500") == DataInfo("synthetic:3,32,32:10:500", (3, 32, 32), 10, 500, 50)
    info = dataset_info(" Synthetic:1,8,8:4 ")  # N defaults; the name is canonical
    assert info.name == "synthetic:1,8,8:4:1024" and info.train_size == 1024 and info.test_size == 102


def test_synthetic_data_are_seeded_and_shaped():
    train, test, info = load_datasets("synthetic:2,5,7:3:40")
    assert (len(train), len(test)) == (40, 4) and info.train_size == 40
    x, y = train[0]
    assert x.shape == (2, 5, 7) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert int(train.tensors[1].min()) >= 0 and int(train.tensors[1].max()) < 3
    again, _, _ = load_datasets("synthetic:2,5,7:3:40")
    assert torch.equal(train.tensors[0], again.tensors[0]) and torch.equal(train.tensors[1], again.tensors[1])
    assert not torch.equal(train.tensors[0][:4], test.tensors[0])  # test is not a copy of train


def test_gather_returns_the_samples_of_the_indices_in_order():
    ds = SyntheticDataset((1, 3, 3), 5, 20, seed=1)
    x, y = ds.gather([7, 2, 19, 2], "cpu")
    assert torch.equal(x, torch.stack([ds[i][0] for i in (7, 2, 19, 2)]))
    assert y.tolist() == [int(ds[i][1]) for i in (7, 2, 19, 2)]


@pytest.mark.parametrize("name,needle", [
    ("synthetic", "expected synthetic:C,H,W:K"),
    ("synthetic:3,32:10", "three sizes C,H,W"),
    ("synthetic:3,32,0:10", "W must be a positive integer"),
    ("synthetic:3,32,32:x", "K \\(classes\\) must be a positive integer"),
    ("synthetic:3,32,32:10:-5", "N \\(samples\\) must be a positive integer"),
    ("synthetic:3,224,224:10:100000", "ask for fewer samples"),
])
def test_bad_synthetic_names_say_which_part_is_wrong(name, needle):
    with pytest.raises(InputError, match=needle):
        parse_synthetic(name)
    with pytest.raises(InputError, match=needle):
        dataset_info(name)


def test_unknown_dataset_names_the_synthetic_form():
    with pytest.raises(InputError, match="synthetic:C,H,W:K\\[:N\\]"):
        dataset_info("svhn")


def test_training_on_synthetic_data_runs_and_resumes_identically(tmp_path):
    from cptsim.run.train import TrainConfig, resume, train

    cfg = TrainConfig(model="digits-cnn", dataset="synthetic:1,8,8:10:100", schedule="cpt:3-8:g8:n2", epochs=2,
                      batch_size=32, checkpoint_every=3)
    ref = train(cfg, str(tmp_path / "ref"), progress=False)
    trace = ref.read_trace().records
    assert [r["batch_size"] for r in trace] == [32, 32, 32, 4] * 2
    assert ref.read_config()["train_size"] == 100

    # a run cut after step 3 (its checkpoint) and resumed gives the same trace as the uninterrupted one
    import os

    os.environ["CPTSIM_FAULT_SIGINT_AT_STEP"] = "3"
    try:
        from cptsim.errors import RunStopped

        with pytest.raises(RunStopped):
            train(cfg, str(tmp_path / "cut"), progress=False)
    finally:
        del os.environ["CPTSIM_FAULT_SIGINT_AT_STEP"]
    cut = resume(str(tmp_path / "cut"), progress=False)

    def strip(rs):
        return [{k: v for k, v in r.items() if k not in ("time_s", "epoch_time_s", "recal_time_s", "energy_j", "power_w")}
                for r in rs]

    assert strip(cut.read_trace().records) == strip(trace)
