"""Launch-bound check on a real GPU: digits-cnn's op list counted on CUDA, its eager step time and kernel count
measured, next to the cost model's estimate on the h100 profile. Run on a CUDA machine from the repo root:

    PYTHONPATH=. python3 benchmarks/gpu/gpu_launch_check.py
"""

import time

import torch

from cptsim.cost.model import estimate
from cptsim.cost.hardware import load_profile
from cptsim.numerics.layers import quantize_model
from cptsim.models import create_model
from cptsim.measure.profiler import profile_model

dev = "cuda"
print(torch.cuda.get_device_name(0), torch.__version__)
torch.manual_seed(0)
m = create_model("digits-cnn", 10, 1)
quantize_model(m)
m = m.to(dev)
t = time.time()
prof = profile_model(m, (1, 8, 8), batch_size=2, model_name="digits-cnn")
print(f"profile_model on cuda: {time.time() - t:.2f} s; ops totals {prof.ops.totals()}")
B = 64
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
x = torch.randn(B, 1, 8, 8, device=dev)
y = torch.randint(10, (B,), device=dev)


def step():
    loss = torch.nn.functional.cross_entropy(m(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


for _ in range(30):
    step()
torch.cuda.synchronize()
t = time.time()
for _ in range(300):
    step()
torch.cuda.synchronize()
eager_us = (time.time() - t) / 300 * 1e6
try:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    ev = [e for e in p.events() if str(e.device_type).endswith("CUDA")]
    kernels = len(ev) / 10
    busy_us = sum(getattr(e, "device_time", getattr(e, "cuda_time", 0.0)) for e in ev) / 10
except Exception as e:  # noqa: BLE001
    kernels = busy_us = float("nan")
    print("profiler failed:", e)
c = estimate(prof, {"batch_size": [B], "bits": [32], "grad_bits": [32]}, load_profile("hw_profiles/h100.toml"))
print(f"measured eager step (batch {B}, fp32): {eager_us:.0f} us; CUDA kernels/step {kernels:.0f}, "
      f"kernel busy time/step {busy_us:.0f} us")
print(f"modelled on h100 profile: {c.latency_s['total'] * 1e6:.0f} us/step, "
      f"{prof.ops.totals()['launches']:.0f} launches/step counted by cptsim.measure.opcount")
