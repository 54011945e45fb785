"""The standard axes. Set their lengths before building a computation that uses them::

    import geon.frontends.base.axis as ax
    ax.C.length, ax.N.length = 64, 128

N is the batch axis and T the recurrent axis; reductions keep both by default.
"""

from geon.op_graph.axes import Axis

N = Axis(name="N", batch=True)   #: batch (samples)
C = Axis(name="C")               #: channels / features
D = Axis(name="D")               #: depth
H = Axis(name="H")               #: height
W = Axis(name="W")               #: width
T = Axis(name="T", recurrent=True)  #: time steps (recurrent)
R = Axis(name="R")               #: filter height
S = Axis(name="S")               #: filter width
K = Axis(name="K")               #: output channels
M = Axis(name="M")               #: output depth
P = Axis(name="P")               #: output height
Q = Axis(name="Q")               #: output width
Y = Axis(name="Y")               #: classes / outputs
