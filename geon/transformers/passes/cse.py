"""Hash-consing: merge ops that compute the same value (common subexpression elimination).

Two ops are merged when they have the same class, the same parameters (the values of
the class's ``attrs``: reduction axes, slice keys, permutations ..., compared with
:func:`~geon.op_graph.params.value_key`), the same result axes and dtype, the same args
(after earlier merges), the same other_deps and the same tags. The later op (in dependency order) is replaced by the
earlier one with :meth:`~geon.transformers.passes.Graph.replace`, so handles to it
follow ``forward`` to the survivor.

Scans of one body over the same args that differ only in which of the body's values
they stack (the reverse derivative under ``remat="none"`` builds such a twin of the
forward scan, stacking the intermediates it reads) become one scan stacking all of them
(:func:`merge_scans`), so the loop runs once.

Never merged:

- placeholders and variables (each is its own storage);
- void ops (``SetItem``, ``Assign``): each is an effect;
- ops with ``initializers``.

Constants merge when their dtype, shape, weakness and bytes (or Python number) are
equal (``0.0`` and ``-0.0`` stay apart; two NaN constants with the same bits merge).

other_deps are part of the key, so two reads of a variable built on either side of a
``SetItem`` (the later one runs after it) stay apart, while two identical reads on the
same side merge.
"""

from geon.errors import GeonError
from geon.op_graph import op_graph as og
from geon.op_graph.nodes import rewriting
from geon.op_graph.params import value_key
from geon.transformers.passes import Pass


def _scan_key(op):
    b = op.body
    return (op.axis, op.reverse, tuple(og.snap(a) for a in op.args),
            frozenset(op.other_deps), b.carries_in, b.xs_in, b.closures_in, b.carries_out)


def merge_scans(graph):
    """Make the scans of ``graph`` that run one body (the same stand-ins and new
    carries) over the same args after the same ops one scan whose ys are all theirs,
    the first of them if its ys hold the others', else a new one."""
    from geon.op_graph.control import Scan, ScanBody
    groups: dict = {}
    for op in graph.ops():
        if isinstance(op, og.Output) and isinstance(op.args[0], Scan) \
                and op.args[0].forward is None:
            groups.setdefault(_scan_key(op.args[0]), {})[op.args[0]] = None
    for scans in groups.values():
        if len(scans) < 2:
            continue
        members = list(scans)
        ys = list(dict.fromkeys(y for m in members for y in m.body.ys_out))
        keep = next((m for m in members if set(m.body.ys_out) >= set(ys)), None)
        if keep is None:
            first = members[0]
            b = first.body
            with rewriting(first):
                keep = Scan(*first.args, body=ScanBody(b.carries_in, b.xs_in,
                                                       b.closures_in, b.carries_out, ys),
                            axis=first.axis, reverse=first.reverse, remat=first.remat,
                            follows=list(first.other_deps))
        index = {y: k for k, y in enumerate(keep.body.ys_out)}
        nc, ny = len(keep.body.carries_out), len(keep.body.ys_out)
        for m in members:
            if m is keep:
                continue
            mc, _, _, my = m.counts
            where = list(range(nc)) + [nc + index[y] for y in m.body.ys_out] \
                + [nc + ny + k for k in range(mc)]
            for out, k in zip(m.outputs, where):
                graph.replace(out, keep.outputs[k])


def cse_key(op):
    """The hash-consing key of ``op``, or ``None`` if it must never be merged."""
    if isinstance(op, og.VoidOp) or op._initializers:
        return None
    if isinstance(op, og.AssignableTensorOp) and not op.is_constant:
        return None
    try:
        names = _KEYED_ATTRS.get(type(op), False)
        if names is False:
            names = _KEYED_ATTRS[type(op)] = _keyed_attrs(type(op))
        if names is None:
            attrs = tuple([value_key(v) for v in op.attr_values().values()])
        else:
            attrs = tuple([value_key(getattr(op, n)) for n in names])
    except TypeError as e:
        raise GeonError(f"{type(op).__name__} {op.name}: {e}; an op's parameters (its "
                        f"class's attrs) are immutable values") from None
    axes = (op.axes.names, op.axes.lengths, op.dtype) if isinstance(op, og.TensorOp) \
        else None
    # most ops have neither other_deps nor tags: no sets to build for them
    deps, tags = op.other_deps, op._tags
    return (type(op), axes, attrs, op.args, frozenset(deps) if len(deps) else None,
            frozenset(tags) if tags else None)


#: op class -> the attrs its key compares one by one (see :func:`_keyed_attrs`)
_KEYED_ATTRS = {}


def _keyed_attrs(cls):
    """The ``attrs`` of ``cls`` that :func:`cse_key` compares one by one: all but
    ``axes`` and ``dtype`` of a tensor op, which the key holds anyway. ``None`` for a
    class that computes its ``attr_values`` itself: all of those are compared."""
    if cls.attr_values is not og.Op.attr_values:
        return None
    if issubclass(cls, og.TensorOp):
        return tuple(n for n in cls.attrs if n not in ("axes", "dtype"))
    return tuple(cls.attrs)


class CommonSubexpressionElimination(Pass):
    """Merge structurally identical ops (see the module docstring).

    After :meth:`run`, ``before`` and ``after`` hold the graph's op counts.
    """

    name = "cse"

    def __init__(self, name=None):
        super().__init__(name)
        self.before = self.after = None

    def run(self, graph, transformer):
        merge_scans(graph)
        order = list(graph.ops())
        self.before = len(order)
        seen = {}
        for op in order:
            # Ops are visited after their args, whose merges already rewired op's args.
            if op.forward is not None:
                continue
            if isinstance(op, og.Output):
                own = op.args[0].outputs[op.index]
                if own is not op:
                    # Its multi-output op was merged into another: read the survivor's
                    # own output, the one its backends compute.
                    graph.replace(op, own)
                    continue
            key = cse_key(op)
            if key is None:
                continue
            first = seen.setdefault(key, op)
            if first is not op:
                graph.replace(op, first)
        self.after = len(graph.ops())
