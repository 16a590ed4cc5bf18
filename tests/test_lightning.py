"""PyTorch Lightning: CPTCallback trains a LightningModule at a schedule and records a run `cptsim report` reads."""

import json
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


@pytest.fixture(scope="module")
def L():
    """lightning.pytorch, imported when a test here runs rather than when the suite is collected: with torchmetrics
    it takes ~2.7 s after torch, which every pytest-xdist worker paid whether or not it ran this file."""
    return pytest.importorskip("lightning.pytorch")


def _tiny(L):
    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(),
                                           torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, i):
            x, y = batch
            return F.cross_entropy(self(x), y)

        def validation_step(self, batch, i):
            x, y = batch
            self.log("val_acc", (self(x).argmax(1) == y).float().mean())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Tiny()


def test_callback_trains_a_lightning_module_and_the_run_reports(L, tmp_path):
    from cptsim.run.integrations.lightning import CPTCallback
    from cptsim.study.report import build_report

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(80, 1, 8, 8), torch.randint(10, (80,)))
    module = _tiny(L)
    cb = CPTCallback("cpt:3-8:g8:n2", run_dir=tmp_path / "run", config={"dataset": "random", "train_size": 80})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging
        trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                            callbacks=[cb])
        trainer.fit(module, DataLoader(data, batch_size=32), DataLoader(data, batch_size=40))
    trace = [json.loads(s) for s in (tmp_path / "run" / "trace.jsonl").read_text().splitlines()]
    assert [r["batch_size"] for r in trace] == [32, 32, 16] * 2
    assert [r["bits"] for r in trace] == cb.scheduler.schedule.bits(6).tolist()
    conv, fc = 32 * 8 * 8 * 8 * 9, 32 * 512 * 10
    assert trace[0]["macs"]["fwd"] == conv + fc and trace[0]["macs"]["dgrad"] == fc  # the data needs no gradient
    metrics = [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and 0 <= metrics[-1]["test_acc"] <= 1
    r = build_report(tmp_path / "run", ["bitfusion"])
    assert r.data["bitops"]["trace_check"]["agrees"] and r.data["run"]["steps_done"] == 6
