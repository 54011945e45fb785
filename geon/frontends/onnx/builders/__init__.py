"""The builders of ONNX operators, one module per family; importing this package
registers every builder in :data:`geon.frontends.onnx.builders.base.OPS`.

=================  ==============================================================
module             operators
=================  ==============================================================
``elementwise``    activations, arithmetic, comparisons, logic, rounding, the
                   trigonometric and hyperbolic functions, remainders
``reductions``     products, softmax, reductions, running sums / products, top-k,
                   einsum, determinants
``shapes``         reshaping, slicing, concatenation, padding, casts, constants,
                   ranges, dropout, one-hot, layouts, crops
``indexing``       gathers and scatters
``nn``             convolution, pooling, normalization, losses, unpooling, folding
``recurrent``      RNN, GRU, LSTM
``sampling``       Resize, Upsample, GridSample, AffineGrid
``quantization``   quantizing, dequantizing, integer and quantized-linear ops
``spectral``       windows, Fourier transforms, mel weights
``bits``           bitwise operators, shifts, bit casts
``control_flow``   If, Loop, Scan (subgraphs as geon's cond, while_loop and scan)
``sequences``      sequences and optionals (held at import), Identity
=================  ==============================================================
"""

from geon.frontends.onnx.builders import (bits, control_flow, elementwise,  # noqa: F401
                                          indexing, nn, quantization, recurrent,
                                          reductions, sampling, sequences, shapes,
                                          spectral)
from geon.frontends.onnx.builders.base import OPS, find_builder, onnx_op

__all__ = ["OPS", "find_builder", "onnx_op"]
