"""SwiGLU activation: ``silu(gate) * up``. Shape ``rows x D`` (gate and up both rows x D).

Built-in: the composition ``gate * sigmoid(gate) * up``, ``mx.compile``d.
"""

from __future__ import annotations

import mlx.core as mx

from . import gated

SOURCE = gated.source("swiglu", "        o.v[k] = T(x / (1.0f + KF_EXP(-x)) * float(u.v[k]));")


def _silu(g: mx.array) -> mx.array:
    return g * mx.sigmoid(g)


SPEC = gated.spec("swiglu", "silu(gate) * up", SOURCE, _silu, __file__)

# the module interface kernelfleet.kernels.runtime dispatches through
builtin = SPEC.builtin
make = SPEC.build
