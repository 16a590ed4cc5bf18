"""Cyclic precision training in a plain PyTorch loop, recorded so that `cptsim report` can read it.

    python examples/own_loop.py [RUN_DIR]        (default runs/own-loop)
    cptsim report RUN_DIR                        executed BitOPs, host time, target hardware, plots

The data is the embedded 8x8 digits and the model cptsim's digits-cnn, so `cptsim cost --model digits-cnn
--dataset digits --schedule cpt:3-8:g8:n8 --steps 69 --batch-size 64` costs exactly what this loop executes.
Any model and DataLoader of yours work the same way: only the five cptsim lines matter.
"""

import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import cptsim
from cptsim.data import load_datasets
from cptsim.models import create_model

out = sys.argv[1] if len(sys.argv) > 1 else "runs/own-loop"
epochs, batch_size, lr, schedule = 3, 64, 0.1, "cpt:3-8:g8:n8"
torch.manual_seed(0)
torch.set_num_threads(1)  # 8x8 images: one thread is fastest

train_set, test_set, info = load_datasets("digits")
train = DataLoader(train_set, batch_size=batch_size, shuffle=True)
test = DataLoader(test_set, batch_size=256)
model = create_model("digits-cnn", num_classes=info.num_classes, in_channels=info.input_shape[0])

precision = cptsim.quantize_model(model)  # Conv2d / Linear -> fake-quantized, in place (classifier stays FP32)
total_steps = epochs * len(train)
sched = cptsim.PrecisionScheduler(precision, schedule, total_steps=total_steps)
opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, total_steps)
rec = cptsim.RunRecorder(out, model, sched, optimizer=opt, config={
    "model": "digits-cnn", "dataset": "digits", "batch_size": batch_size, "lr": lr, "epochs": epochs,
    "train_size": len(train_set), "test_size": len(test_set), "num_classes": info.num_classes})

for epoch in range(epochs):
    model.train()
    for x, y in train:
        sched.step()  # this step's forward / gradient bits
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        cosine.step()
        rec.step(loss=loss.item(), batch_size=len(x))  # bits, MACs, BitOPs and time of the step

    model.eval()
    correct = 0
    with torch.no_grad(), sched.evaluating():  # at q_max, the precision the trained model is meant for
        for x, y in test:
            correct += (model(x).argmax(1) == y).sum().item()
    rec.epoch(test_acc=correct / len(test_set))
    print(f"epoch {epoch}: test accuracy {correct / len(test_set):.3f} at {sched.eval_bits} bits")

rec.close()
print(f"recorded {total_steps} steps in {rec.path}; now run: cptsim report {rec.path}")
