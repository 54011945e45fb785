"""NumPy code for :mod:`geon.op_graph.control_ops`: ``cond`` and ``while_loop``.

As for a scan (:mod:`geon.transformers.numpy.control`), each subgraph is compiled once
into a computation of its own (every pass runs inside it) and found by the generated
code through ``_scan_bodies``. A :class:`~geon.op_graph.control_ops.Cond` is an ``if``
calling the chosen branch's computation; a
:class:`~geon.op_graph.control_ops.WhileLoop` is a Python ``while`` loop calling the
predicate's computation, then the body's.
"""

from geon.op_graph.control_ops import Cond, WhileLoop
from geon.transformers.numpy.code_table import numpy_code
from geon.transformers.numpy.control import body_runner


def _targets(names):
    return ", ".join(names) + ("," if len(names) == 1 else "")


@numpy_code(Cond)
def _cond_numpy(op, out, args):
    """``out``: one buffer per result (None: not read)."""
    true, false = (body_runner(b) for b in op.branches)
    ins = ", ".join(f"_contiguous({a})" for a in args[1:])
    r = [f"_cd_r{k}" for k in range(len(op.outputs))]
    lines = [f"if {args[0]} != 0:  # the true branch's computation",
             f"    {_targets(r)} = _scan_bodies[{true.token}]({ins})",
             "else:  # the false branch's",
             f"    {_targets(r)} = _scan_bodies[{false.token}]({ins})"]
    return lines + [f"np.copyto({o}, {n})" for o, n in zip(out, r) if o is not None]


@numpy_code(WhileLoop)
def _while_numpy(op, out, args):
    """``out``: the final carries (None: not read)."""
    nc = op.n_carries
    pred, body = body_runner(op.pred), body_runner(op.body)
    c = [f"_wl_c{k}" for k in range(nc)]
    ks = [f"_wl_k{k}" for k in range(len(args) - nc)]
    lines = [f"_wl_p = _scan_bodies[{pred.token}]  # the predicate's computation",
             f"_wl_f = _scan_bodies[{body.token}]  # the body's"]
    lines += [f"{n} = _contiguous({a})" for n, a in zip(c + ks, args)]
    ins = ", ".join(c + ks)
    if op.max_steps is None:
        lines.append(f"while _wl_p({ins})[0] != 0:")
    else:
        lines += ["_wl_n = 0", f"while _wl_n < {op.max_steps} and _wl_p({ins})[0] != 0:",
                  "    _wl_n += 1"]
    lines.append(f"    {_targets(c)} = _wl_f({ins})")
    return lines + [f"np.copyto({o}, {n})" for o, n in zip(out, c) if o is not None]
