"""Control flow: ``If`` as :func:`geon.cond`, ``Loop`` as :func:`geon.while_loop` or
:func:`geon.scan`, ``Scan`` as :func:`geon.scan`.

A node's subgraph (a ``GraphProto`` attribute) is imported by the importer's own
machinery, node by node, inside the function that ``cond`` / ``while_loop`` / ``scan``
calls on stand-ins: its formal inputs are the stand-ins (as NumPy-family tensors), and
a name it reads from the enclosing graphs is that graph's value, which the control-flow
op then takes as a closure. A subgraph whose value is known at import (an ``If`` with a
known condition) is imported alone, and a ``Loop`` whose body needs its iteration number
at import (a ``Slice`` at it, say) and whose trip count is known and small is unrolled.

Sequences and optionals are structures the importer holds at import
(:mod:`geon.frontends.onnx.structures`): ``SequenceMap`` imports its body once per
position of the sequences; an ``If`` whose branches give them imports the
branch taken when its condition is known at import, and otherwise chooses each tensor
inside at run time when both branches give the same structure (sequences of the same
length, tensors of the same shapes and types); a ``Loop`` that carries them is unrolled
at import, its trip count, initial condition and the body's condition at each iteration
known then.
"""

import numpy as np

import geon as be
from geon.errors import GeonError
from geon.frontends.onnx.builders.base import cast, onnx_op, takes_structures
from geon.frontends.onnx.loading import (InvalidOnnxModel, UnsupportedOnnxOp, onnx_module,
                                         tensor_array)
from geon.frontends.onnx.structures import (OptionalValue, SequenceValue,
                                            describe_signature, is_structure, kind, leaves,
                                            rebuild, signature, value_type)
from geon.op_graph.coercion import canonical_axes

gnp = be.np

#: A ``Loop`` that must be unrolled (its body needs its iteration number at import)
#: is unrolled only for at most this many iterations.
UNROLL_LIMIT = 256

#: A ``Loop`` carrying sequences or optionals (unrolled at import, since they exist at
#: import only) is unrolled for at most this many iterations.
STRUCTURE_UNROLL_LIMIT = 10_000


def _graph(ctx, name):
    """The subgraph attribute ``name`` (a ``GraphProto``), marked as read."""
    ctx.read.add(name)
    a = ctx.attrs.get(name)
    if a is None or a.type != onnx_module().AttributeProto.GRAPH:
        raise ctx.unsupported(f"attribute {name!r} is missing or not a graph")
    return a.g


def import_subgraph(ctx, graph, inputs):
    """The values of ``graph``'s outputs, its formal inputs bound to ``inputs`` (one
    :class:`~geon.frontends.onnx.importer.Value` each) and the names of the enclosing
    graphs in scope."""
    if len(inputs) != len(graph.input):
        raise ctx.unsupported(f"its subgraph {graph.name!r} takes {len(graph.input)} "
                              f"inputs, {len(inputs)} given")
    values = dict(ctx.scope)
    for vi, v in zip(graph.input, inputs):
        values[vi.name] = v
    for t in graph.initializer:
        values[t.name] = ctx.known(tensor_array(t, None, f"{ctx.where}: initializer "
                                                         f"{t.name!r}"))
    if graph.sparse_initializer:
        raise ctx.unsupported("sparse initializers in a subgraph")
    ctx.import_graph(graph, values)
    missing = [o.name for o in graph.output if o.name not in values]
    if missing:
        raise ctx.unsupported(f"its subgraph {graph.name!r} does not make {missing}")
    return [values[o.name] for o in graph.output]


def _positional(op):
    """``op`` with the canonical NumPy-family axes of its shape."""
    axes = canonical_axes(tuple(a.length for a in op.axes))
    return op if op.axes == axes else be.cast_axes(op, axes)


def _scalar(ctx, i):
    t = ctx.tensor(i)
    if int(np.prod(ctx.shape(i))) != 1:
        raise ctx.unsupported(f"input {i} has shape {ctx.shape(i)}; one element expected")
    return gnp.reshape(t, ()) if ctx.shape(i) else t


def _flag(op):
    """``op != 0`` as 1.0 / 0.0 in float32 (how a boolean is carried)."""
    return cast(cast(op, np.bool_), np.float32)


def _truth(array):
    return bool(np.asarray(array).reshape(-1)[0])


def _stand_in_values(ctx, ops, like):
    """Values for stand-ins ``ops`` with the ONNX types of ``like`` (Values)."""
    return [ctx.out(_positional(op), v.dtype) for op, v in zip(ops, like)]


def _geon_errors(ctx, fn):
    """``fn()``, a geon error raised while it builds made :class:`UnsupportedOnnxOp`
    (branches or steps whose shapes or types differ, which geon's ops do not hold)."""
    try:
        return fn()
    except UnsupportedOnnxOp:
        raise
    except GeonError as e:
        raise ctx.unsupported(f"{type(e).__name__}: {e}") from None


# --- If ---------------------------------------------------------------------------------

@onnx_op("If", 1)
@takes_structures
def _if(ctx):
    """``cond(c, then, else)``; a condition known at import imports its branch alone.
    Branches giving sequences or optionals choose each tensor inside at run time, when
    both give the same structure."""
    then_g, else_g = _graph(ctx, "then_branch"), _graph(ctx, "else_branch")
    c = ctx.value(0)
    if is_structure(c):
        raise ctx.unsupported(f"its condition is {kind(c)}, not a tensor")
    if c.array is not None:
        return import_subgraph(ctx, then_g if _truth(c.array) else else_g, [])
    pred = _scalar(ctx, 0)
    types, sigs = {}, {}

    def branch(g, name):
        def build():
            outs = import_subgraph(ctx, g, [])
            types[name] = [v.dtype for v in outs]
            sigs[name] = [signature(v) for v in outs]
            if not any(is_structure(v) for v in outs):
                return tuple(v.tensor() for v in outs)
            flat = tuple(x.tensor() for v in outs for x in leaves(v))
            # (a branch of no tensor at all still gives cond one result)
            return flat or (gnp.constant(0.0, dtype=np.float32),)
        return build

    def structures_differ():
        return len(sigs) == 2 and sigs["then"] != sigs["else"] and any(
            s[0] != "tensor" for s in sigs["then"] + sigs["else"])
    try:
        res = be.cond(pred, branch(then_g, "then"), branch(else_g, "else"))
    except UnsupportedOnnxOp:
        raise
    except GeonError as e:
        if structures_differ():
            raise _structures_differ(ctx, sigs) from None
        raise ctx.unsupported(f"{type(e).__name__}: {e}") from None
    if structures_differ():
        raise _structures_differ(ctx, sigs)
    if types["then"] != types["else"]:
        raise ctx.unsupported(f"its branches give the types {types['then']} and "
                              f"{types['else']}")
    if not isinstance(res, tuple):
        res = (res,)
    flat = iter(res)
    return [rebuild(sig, lambda d: ctx.out(_positional(next(flat)), d))
            for sig in sigs["then"]]


def _structures_differ(ctx, sigs):
    """The refusal of an ``If`` whose condition is computed at run time and whose
    branches give different sequences or optionals (its ``value_name``: the
    condition)."""
    then = ", ".join(describe_signature(s) for s in sigs["then"])
    other = ", ".join(describe_signature(s) for s in sigs["else"])
    e = ctx.unsupported(
        f"its condition ({ctx.node.input[0]!r}) is computed at run time and its branches "
        f"give different sequences or optionals ({then}; {other}): these are held at "
        f"import, so a choice at run time needs the same structure in both (sequences "
        f"of the same length, tensors of the same shapes and types); the condition "
        f"must be known at import")
    e.value_name = ctx.node.input[0]
    return e


# --- Loop --------------------------------------------------------------------------------

def _loop_counts(ctx, body):
    n_carried = ctx.n_inputs() - 2
    n_scan = len(body.output) - 1 - n_carried
    if n_carried < 0 or n_scan < 0 or len(body.input) != n_carried + 2:
        raise ctx.unsupported(f"its body has {len(body.input)} inputs and "
                              f"{len(body.output)} outputs for {max(n_carried, 0)} loop-"
                              f"carried values")
    return n_carried, n_scan


@onnx_op("Loop", 1)
@takes_structures
def _loop(ctx):
    """Without scan outputs, a ``while_loop`` over (iteration, condition, carried
    values); with them, a ``scan`` over the trip count (known at import, the condition
    staying true). A body that needs its iteration number at import is unrolled, and so
    is a loop carrying sequences or optionals."""
    body = _graph(ctx, "body")
    n_carried, n_scan = _loop_counts(ctx, body)
    for i in (0, 1):
        if ctx.has(i) and is_structure(ctx.value(i)):
            raise ctx.unsupported(f"input {i} is {kind(ctx.value(i))}, not a tensor")
    carried = [ctx.value(2 + k) for k in range(n_carried)]
    if any(is_structure(v) for v in carried):
        return _unrolled_structures(ctx, body, carried, n_scan)
    if n_scan:
        trips = int(np.asarray(ctx.const(0)).reshape(-1)[0]) if ctx.has(0) else None
        if trips is None:
            raise ctx.unsupported("scan outputs without a trip count (their length is "
                                  "not known at import)")
        if ctx.has(1) and not _truth(ctx.const(1)):
            trips = 0
    try:
        if n_scan:
            return _loop_as_scan(ctx, body, carried, trips, n_scan)
        return _loop_as_while(ctx, body, carried)
    except UnsupportedOnnxOp as e:
        if getattr(e, "value_name", None) is None:
            raise
        return _unrolled(ctx, body, carried, n_scan, e)


def _loop_as_while(ctx, body, carried):
    trip = _scalar(ctx, 0) if ctx.has(0) else None
    go = _flag(_scalar(ctx, 1)) if ctx.has(1) else gnp.constant(1.0, dtype=np.float32)
    i0 = gnp.constant(0, dtype=np.int64)
    bool_v = ctx.known(np.array(True))
    state = {}

    def cond_fn(c):
        more = gnp.not_equal(c[1], 0)
        return more if trip is None else more * gnp.less(c[0], trip)

    def body_fn(c):
        ins = [ctx.out(c[0], np.int64), ctx.out(c[1], bool_v.dtype)]
        ins += _stand_in_values(ctx, c[2:], carried)
        outs = import_subgraph(ctx, body, ins)
        state["types"] = [v.dtype for v in outs[1:]]
        more = outs[0].tensor()
        if more.axes:
            more = gnp.reshape(more, ())
        return (c[0] + 1, _flag(more)) + tuple(v.tensor() for v in outs[1:])
    init = (i0, go) + tuple(v.tensor() for v in carried)
    final = _geon_errors(ctx, lambda: be.while_loop(cond_fn, body_fn, init))
    _check_types(ctx, state["types"], [v.dtype for v in carried])
    return [ctx.out(_positional(f), v.dtype) for f, v in zip(final[2:], carried)]


def _check_types(ctx, got, want):
    if list(got) != list(want):
        raise ctx.unsupported(f"its body gives the loop-carried values the types {got}, "
                              f"not {want}")


def _loop_as_scan(ctx, body, carried, trips, n_scan):
    if trips <= 0:
        raise ctx.unsupported("scan outputs of a loop that runs no iteration (empty)")
    steps = be.Axis(trips, f"onnx_loop_{len(ctx.scope)}")
    counter = be.constant(np.arange(trips, dtype=np.int64), axes=[steps])
    state = {}
    true = ctx.known(np.array(True))

    def fn(carries, t):
        ins = [ctx.out(_positional(t), np.int64), true]
        ins += _stand_in_values(ctx, carries, carried)
        outs = import_subgraph(ctx, body, ins)
        state["more"], state["outs"] = outs[0], outs
        return (tuple(v.tensor() for v in outs[1:1 + len(carried)]),
                tuple(v.tensor() for v in outs[1 + len(carried):]))
    init = tuple(v.tensor() for v in carried)
    final, ys = _geon_errors(ctx, lambda: be.scan(fn, init, counter, steps))
    more = state["more"]
    if more.array is None and more is not state["outs"][0] or \
            more.array is not None and not _truth(more.array):
        raise ctx.unsupported("scan outputs of a loop whose body computes its condition "
                              "(their length is not known at import)")
    outs = state["outs"]
    _check_types(ctx, [v.dtype for v in outs[1:1 + len(carried)]],
                 [v.dtype for v in carried])
    res = [ctx.out(_positional(f), v.dtype) for f, v in zip(final, carried)]
    return res + [ctx.out(_positional(y), v.dtype)
                  for y, v in zip(ys, outs[1 + len(carried):])]


def _unrolled(ctx, body, carried, n_scan, why):
    """The loop's iterations one after another, each with its iteration number (and
    condition) known at import."""
    trips = ctx.const(0) if ctx.has(0) else None
    more = _truth(ctx.const(1)) if ctx.has(1) else True
    if trips is None or int(np.asarray(trips).reshape(-1)[0]) > UNROLL_LIMIT:
        raise why
    values, scans = list(carried), [[] for _ in range(n_scan)]
    for i in range(int(np.asarray(trips).reshape(-1)[0])):
        if not more:
            break
        ins = [ctx.known(np.array(i, dtype=np.int64)), ctx.known(np.array(True))] + values
        outs = import_subgraph(ctx, body, ins)
        if outs[0].array is None:
            raise ctx.unsupported("its body needs its iteration number at import and "
                                  "computes its condition at run time") from None
        more = _truth(outs[0].array)
        values = outs[1:1 + len(carried)]
        for s, v in zip(scans, outs[1 + len(carried):]):
            s.append(v)
    if n_scan and not scans[0]:
        raise ctx.unsupported("scan outputs of a loop that runs no iteration (empty)")
    res = list(values)
    for s in scans:
        if all(v.array is not None for v in s):
            res.append(ctx.known(np.stack([v.array for v in s])))
        else:
            res.append(ctx.out(gnp.stack([v.tensor() for v in s], 0), s[0].dtype))
    return res


def _known_loop_input(ctx, i, what):
    """Input ``i`` of a loop carrying sequences or optionals (the trip count or the
    condition), which must be known at import."""
    v = ctx.value(i)
    if v.array is None:
        e = ctx.unsupported(
            f"{what} ({ctx.node.input[i]!r}) is computed at run time; the loop carries "
            f"sequences or optionals, which are held at import, so it is unrolled at "
            f"import and needs {what} known then (a constant, or a graph input fixed "
            f"with input_values=)")
        e.value_name = ctx.node.input[i]
        raise e
    return np.asarray(v.array).reshape(-1)[0]


def _unrolled_structures(ctx, body, carried, n_scan):
    """A loop carrying sequences or optionals, unrolled at import: each iteration is
    the body's nodes imported as ordinary ops, its iteration number a constant, and the
    body's condition known at import at each iteration."""
    trips = int(_known_loop_input(ctx, 0, "its trip count")) if ctx.has(0) else None
    more = _truth(_known_loop_input(ctx, 1, "its condition")) if ctx.has(1) else True
    if trips is not None and trips > STRUCTURE_UNROLL_LIMIT:
        raise ctx.unsupported(f"its trip count is {trips}: a loop carrying sequences or "
                              f"optionals is unrolled at import, for at most "
                              f"{STRUCTURE_UNROLL_LIMIT} iterations")
    values, scans = list(carried), [[] for _ in range(n_scan)]
    i = 0
    while more and (trips is None or i < trips):
        if i == STRUCTURE_UNROLL_LIMIT:
            raise ctx.unsupported(f"its condition is still true after "
                                  f"{STRUCTURE_UNROLL_LIMIT} iterations: a loop carrying "
                                  f"sequences or optionals is unrolled at import, for at "
                                  f"most {STRUCTURE_UNROLL_LIMIT} iterations")
        ins = [ctx.known(np.array(i, dtype=np.int64)), ctx.known(np.array(True))] + values
        outs = import_subgraph(ctx, body, ins)
        cond = outs[0]
        if is_structure(cond) or cond.array is None:
            raise ctx.unsupported(
                f"its body's condition ({body.output[0].name!r}) is computed at run time "
                f"(iteration {i}); the loop carries sequences or optionals, which are "
                f"held at import, so it is unrolled at import and needs the condition "
                f"known then")
        more = _truth(cond.array)
        new = outs[1:1 + len(carried)]
        for k, (old, v) in enumerate(zip(values, new)):
            if is_structure(old) != is_structure(v):
                raise ctx.unsupported(f"its body gives loop-carried value {k} as "
                                      f"{kind(v)}, where it was {kind(old)}")
        values = new
        for s, v in zip(scans, outs[1 + len(carried):]):
            if is_structure(v):
                raise ctx.unsupported(f"its scan outputs are {kind(v)}; tensors only")
            s.append(v)
        i += 1
    if n_scan and not scans[0]:
        raise ctx.unsupported("scan outputs of a loop that runs no iteration (empty)")
    res = list(values)
    for s in scans:
        if all(v.array is not None for v in s):
            res.append(ctx.known(np.stack([v.array for v in s]), s[0].dtype))
        else:
            res.append(ctx.out(gnp.stack([v.tensor() for v in s], 0), s[0].dtype))
    return res


# --- SequenceMap -----------------------------------------------------------------------

@onnx_op("SequenceMap", 17)
@takes_structures
def _sequence_map(ctx):
    """The body applied to each position of the input sequences (the tensor inputs
    given whole to every application), unrolled at import: sequences are held at
    import, their length known then."""
    body = _graph(ctx, "body")
    ins = [ctx.value(i) for i in range(ctx.n_inputs())]
    if len(body.input) != len(ins):
        raise ctx.unsupported(f"its body takes {len(body.input)} inputs, {len(ins)} given")
    lengths = {len(v.items) for v in ins if isinstance(v, SequenceValue)}
    if not isinstance(ins[0], SequenceValue) or len(lengths) != 1:
        raise InvalidOnnxModel(f"{ctx.where}: its first input must be a sequence, and all "
                               f"its sequences of one length (they have {sorted(lengths)})")
    if any(isinstance(v, OptionalValue) for v in ins):
        raise ctx.unsupported("optional inputs")
    n = lengths.pop()
    if n > STRUCTURE_UNROLL_LIMIT:
        raise ctx.unsupported(f"its sequences have {n} tensors: it is unrolled at import, "
                              f"for at most {STRUCTURE_UNROLL_LIMIT}")
    outs = [[] for _ in body.output]
    for j in range(n):
        got = import_subgraph(ctx, body, [v.items[j] if isinstance(v, SequenceValue)
                                          else v for v in ins])
        for o, v in zip(outs, got):
            if is_structure(v):
                raise ctx.unsupported(f"its body gives {kind(v)}; tensors only")
            o.append(v)
    res = []
    for o, vi in zip(outs, body.output):
        types = {v.dtype for v in o}
        if len(types) > 1:
            raise InvalidOnnxModel(f"{ctx.where}: its body gives {vi.name!r} the types "
                                   f"{sorted(str(t) for t in types)}")
        dtype = types.pop() if types else value_type(vi.type, f"{ctx.where}: body output "
                                                             f"{vi.name!r}")[1]
        res.append(SequenceValue(o, dtype))
    return res


# --- Scan --------------------------------------------------------------------------------

def _scan_attrs(ctx, n_in, n_out, ranks_in, version):
    if version < 9:
        dirs = ctx.attr("directions") or [0] * n_in
        return dirs, [0] * n_in, [0] * n_out, [0] * n_out
    dirs = ctx.attr("scan_input_directions") or [0] * n_in
    in_axes = ctx.attr("scan_input_axes") or [0] * n_in
    out_dirs = ctx.attr("scan_output_directions") or [0] * n_out
    out_axes = ctx.attr("scan_output_axes") or [0] * n_out
    in_axes = [a % r if r else 0 for a, r in zip(in_axes, ranks_in)]
    return dirs, in_axes, out_dirs, out_axes


def _scan_once(ctx, body, states, seqs, attrs):
    """One ONNX scan (no batch axis) as :func:`geon.scan`: ``(final states, scan
    outputs)`` as Values."""
    dirs, in_axes, out_dirs, out_axes = attrs
    lengths = {gnp.shape(s.tensor())[a] for s, a in zip(seqs, in_axes)}
    if len(lengths) != 1:
        raise ctx.unsupported(f"its scan inputs have the lengths {sorted(lengths)}")
    steps = be.Axis(lengths.pop(), f"onnx_scan_{len(ctx.scope)}")
    xs = []
    for s, d, a in zip(seqs, dirs, in_axes):
        t = s.tensor()
        if a:
            order = [a] + [k for k in range(len(gnp.shape(t))) if k != a]
            t = gnp.transpose(t, order)
        if d:
            t = t[::-1]
        shape = gnp.shape(t)
        xs.append(be.cast_axes(t, [steps] + list(canonical_axes(shape[1:]))))
    types = {}

    def fn(carries, x_t):
        ins = _stand_in_values(ctx, carries, states) + _stand_in_values(ctx, x_t, seqs)
        outs = import_subgraph(ctx, body, ins)
        types["outs"] = outs
        return (tuple(v.tensor() for v in outs[:len(states)]),
                tuple(v.tensor() for v in outs[len(states):]))
    final, ys = _geon_errors(ctx, lambda: be.scan(
        fn, tuple(v.tensor() for v in states), tuple(xs), steps))
    outs = types["outs"]
    _check_types(ctx, [v.dtype for v in outs[:len(states)]], [v.dtype for v in states])
    res = [ctx.out(_positional(f), v.dtype) for f, v in zip(final, states)]
    for y, v, d, a in zip(ys, outs[len(states):], out_dirs, out_axes):
        y = _positional(y)
        if d:
            y = y[::-1]
        rank = len(gnp.shape(y))
        a = a % rank
        if a:
            order = list(range(1, a + 1)) + [0] + list(range(a + 1, rank))
            y = gnp.transpose(y, order)
        res.append(ctx.out(y, v.dtype))
    return res


@onnx_op("Scan", 8)
def _scan(ctx):
    """A ``scan`` over the scan inputs' axis; opset 8's batch axis (first) is a loop of
    scans, one per batch entry."""
    body = _graph(ctx, "body")
    n_in = ctx.attr("num_scan_inputs")
    first = 1 if ctx.version < 9 else 0
    if first and ctx.has(0):
        raise ctx.unsupported("sequence_lens")
    vals = [ctx.value(i) for i in range(first, ctx.n_inputs())]
    n_state = len(vals) - n_in
    n_out = len(body.output) - n_state
    states, seqs = vals[:n_state], vals[n_state:]
    if ctx.version >= 9:
        attrs = _scan_attrs(ctx, n_in, n_out, [len(v.shape) for v in seqs], ctx.version)
        return _scan_once(ctx, body, states, seqs, attrs)
    attrs = _scan_attrs(ctx, n_in, n_out, None, ctx.version)
    batch = {v.shape[0] for v in vals}
    if len(batch) != 1:
        raise ctx.unsupported(f"its inputs have the batch sizes {sorted(batch)}")
    per = []
    for b in range(batch.pop()):
        def row(v):
            return ctx.out(_positional(v.tensor()[b]), v.dtype)
        per.append(_scan_once(ctx, body, [row(v) for v in states],
                              [row(v) for v in seqs], attrs))
    return [ctx.out(gnp.stack([p[k].tensor() for p in per], 0), per[0][k].dtype)
            for k in range(len(per[0]))]


__all__ = ["STRUCTURE_UNROLL_LIMIT", "UNROLL_LIMIT", "import_subgraph"]
