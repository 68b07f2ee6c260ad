"""How long Dynamo/AOTAutograd take to trace the training step of a 6+6-layer model (d 64) on
the CPU: static shapes, every dimension symbolic, only the batch dimension symbolic.

    python experiments/gpu_speed/trace_time.py aot_eager false x   # static, then batch-only
    python experiments/gpu_speed/trace_time.py aot_eager true      # every dimension symbolic
"""

import sys
import time
from dataclasses import asdict

import torch

from aiayn import kernels
from aiayn.kernels import loss as kl
from aiayn.model import ModelConfig
from aiayn.training.module import TranslationModule

kl.GPU_DEVICES = ("cuda", "cpu")
kernels.use("gpu")
backend, dynamic = sys.argv[1], {"true": True, "false": False}[sys.argv[2]]
cfg = ModelConfig(src_vocab_size=1000, tgt_vocab_size=1000, d_model=64, num_heads=8, d_ff=128)
m = TranslationModule(
    asdict(cfg), {"schedule": "inverse_sqrt", "lr": 1e-3, "warmup_steps": 10}, {}
).train()
c = torch.compile(m._losses, backend=backend, dynamic=dynamic)
src = torch.randint(4, 1000, (16, 12))
tgt = torch.randint(4, 1000, (16, 11))
t = time.time()
loss, _ = c(src, tgt[:, :-1], tgt[:, 1:])
loss.backward()
print(backend, dynamic, "first call", round(time.time() - t, 1), "s")
if len(sys.argv) > 3:
    torch._dynamo.reset()
    m.zero_grad()
    c = torch.compile(m._losses, backend=backend, dynamic=False)
    a, b, d = src, tgt[:, :-1], tgt[:, 1:]
    for t_ in (a, b, d):
        torch._dynamo.mark_dynamic(t_, 0)
    t = time.time()
    loss, _ = c(a, b, d)
    loss.backward()
    print(backend, "batch dim only", "first call", round(time.time() - t, 1), "s")
    src2 = torch.randint(4, 1000, (9, 12))
    tgt2 = torch.randint(4, 1000, (9, 11))
    t = time.time()
    loss, _ = c(src2, tgt2[:, :-1], tgt2[:, 1:])
    loss.backward()
    print("another batch size", round(time.time() - t, 1), "s")
