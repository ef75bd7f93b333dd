"""SwiGLU activation: ``silu(gate) * up``. Shape ``rows x D`` (gate and up both rows x D).

Built-in: the composition ``gate * sigmoid(gate) * up``, ``mx.compile``d.
"""

from __future__ import annotations

import mlx.core as mx

from . import gated

# fm=1: __expf on CUDA (x / (1 + e^-x) saturates to x or -0 where e^-x over- or underflows)
SOURCE = gated.source(
    "swiglu",
    "        const float e = FM ? KF_EXP_FAST(-x) : KF_EXP(-x);\n"
    "        o.v[k] = T(x / (1.0f + e) * float(u.v[k]));",
)


def _silu(g: mx.array) -> mx.array:
    return g * mx.sigmoid(g)


SPEC = gated.spec("swiglu", "silu(gate) * up", SOURCE, _silu, __file__)

# the module interface kernelfleet.kernels.patch.runtime dispatches through
builtin = SPEC.builtin
make = SPEC.build
