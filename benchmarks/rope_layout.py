"""Rope in the layout attention holds it, and what the layout costs attention (issue 17).

    python3 -P benchmarks/rope_layout.py      # GPU host, kernelfleet on PYTHONPATH (see model.py)

One Llama-3-8B layer's prefill of 2048 tokens (32 query heads, 8 KV heads, head dim 128, bfloat16):
q and k are the transposed views mlx-lm's attention hands ``nn.RoPE``. Times, median of 7 batches of 20
calls: rope of q by ``mx.fast.rope``, by our kernel from a row-contiguous copy (the catalog layout),
and by our kernel reading the attention layout (``heads_inner``); the copy alone; scaled dot-product
attention with q as the transposed view and as a row-contiguous array; and rope + attention each way.
The rope config is the H100 model profile's choice at 32x2048x128.
"""
import time

import mlx.core as mx

from kernelfleet.kernels.patch import profile_view, runtime

view = profile_view.load("benchmarks/results/h100_model_profile.json", runtime.target().chip)
cfg = view.choice("rope", (32, 2048, 128), "bfloat16")
print("rope config", cfg)
B, L, H, KVH, D = 1, 2048, 32, 8, 128
base = 500000.0
xq = mx.random.normal((B, L, H * D)).astype(mx.bfloat16)
xk = mx.random.normal((B, L, KVH * D)).astype(mx.bfloat16)
xv = mx.random.normal((B, L, KVH * D)).astype(mx.bfloat16)
mx.eval(xq, xk, xv)
off = mx.array([0], mx.int32)
def views():
    return (xq.reshape(B, L, H, D).transpose(0, 2, 1, 3), xk.reshape(B, L, KVH, D).transpose(0, 2, 1, 3),
            xv.reshape(B, L, KVH, D).transpose(0, 2, 1, 3))
def frope(t):
    return mx.fast.rope(t, D, traditional=False, base=base, scale=1.0, offset=0)
def orope(t, rows):
    return runtime.run("rope", [t, off], (rows, L, D), cfg, base=base)[0]
def irope(t, rows):
    return runtime.run("rope", [t, off], (rows, L, D), cfg, base=base, heads_inner=True)[0]
def sdpa(q, k, v):
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=D ** -0.5, mask="causal")
cases = {
    "stock: fast.rope q,k + sdpa": lambda: (lambda q, k, v: sdpa(frope(q), frope(k), v))(*views()),
    "ours q, fast k + sdpa": lambda: (lambda q, k, v: sdpa(orope(q, H), frope(k), v))(*views()),
    "ours heads_inner q, fast k + sdpa": lambda: (lambda q, k, v: sdpa(irope(q, H), frope(k), v))(*views()),
    "rope only: ours heads_inner q": lambda: irope(views()[0], H),
    "rope only: fast q": lambda: frope(views()[0]),
    "rope only: ours q": lambda: orope(views()[0], H),
    "sdpa only, q transposed view": lambda: (lambda q, k, v: sdpa(q, k, v))(*views()),
    "sdpa only, q contiguous": lambda: (lambda q, k, v: sdpa(mx.contiguous(q), k, v))(*views()),
    "contiguous(q) only": lambda: mx.contiguous(views()[0]),
}
for name, f in cases.items():
    for _ in range(3):
        mx.eval(f())
    best = []
    for _ in range(7):
        t = time.perf_counter()
        mx.eval([f() for _ in range(20)])
        best.append((time.perf_counter() - t) / 20 * 1e6)
    best.sort()
    print(f"{name:34} median {best[3]:8.1f} us  min {best[0]:8.1f}")
