"""GeGLU activation (tanh GELU): ``gelu_tanh(gate) * up``. Shape ``rows x D`` (gate and up both rows x D).

Built-in: the composition ``0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * up``, ``mx.compile``d.
"""

from __future__ import annotations

import mlx.core as mx

from . import gated

# fm=1: 0.5 x (1 + tanh(y)) = x / (1 + e^(-2y)), one fast exponential instead of the precise tanh
SOURCE = gated.source(
    "geglu",
    "        const float y = 0.7978845608028654f * (x + 0.044715f * x * x * x);\n"
    "        const float gl = FM ? x / (1.0f + KF_EXP_FAST(-2.0f * y)) : 0.5f * x * (1.0f + KF_TANH(y));\n"
    "        o.v[k] = T(gl * float(u.v[k]));",
)


def _gelu_tanh(g: mx.array) -> mx.array:
    return 0.5 * g * (1.0 + mx.tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)))


SPEC = gated.spec("geglu", "gelu_tanh(gate) * up", SOURCE, _gelu_tanh, __file__)

# the module interface kernelfleet.kernels.patch.runtime dispatches through
builtin = SPEC.builtin
make = SPEC.build
