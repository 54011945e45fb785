"""Printing graphs: a text dump (one line per op) and DOT for graphviz.

Each line of :func:`graph_text` reads ::

    name = OpType(arg, arg; attribute=value) : (axis:length, ...) dtype \
        after [dep] {tag}  # file:line <- origin

(on one line; ``after``, the tags and ``<- origin`` appear only when there are any).

``after`` lists other_deps (ops that must run first, such as an earlier ``SetItem``),
``origin`` is the ``derived_from`` of an op a pass built (``"<Class> <name>"`` of the
user's op it computes), and ``file:line`` is where the user built the op, or the op it
came from. Ops are listed after their args. A name used by several ops is followed by
``#n`` (the n-th of that name) so references stay unambiguous.

The printers show the ops as the user built them, also after a transformer compiled
them; ``lowered=True`` follows ``forward`` to the ops that compute the values now.
To see a graph after a pass of a transformer's pipeline, build the transformer with
``dump_after=["lower"]`` (it prints during compilation) or call :func:`graph_after`,
which works on a copy and leaves the user's graph alone.
"""

import os
import shutil
import subprocess
import sys
from typing import Any, Sequence, Union

from geon.errors import GeonError
from geon.op_graph import op_graph as og
from geon.op_graph.params import (clone_graph, graph_ops, show_axes, show_value,
                                  signature_defaults, value_key)
from geon.registry import make_transformer


def _labels(order):
    count = {}
    for op in order:
        count[op.name] = count.get(op.name, 0) + 1
    seen, labels = {}, {}
    for op in order:
        if count[op.name] == 1:
            labels[op] = op.name
        else:
            k = seen.get(op.name, 0) + 1
            seen[op.name] = k
            labels[op] = f"{op.name}#{k}"
    return labels


def _location(op, full_paths):
    fn = str(op.filename)
    if not full_paths and not fn.startswith("<"):
        fn = os.path.basename(fn)
    return f"{fn}:{op.lineno}"


def describe_attrs(op):
    """The parameters of ``op`` (its class's ``attrs``) as text, such as
    ``"reduction_axes=(C:3)"``, or ``""``. ``axes`` and ``dtype`` are shown as the op's
    type, and parameters equal to the constructor's default are left out."""
    defaults = signature_defaults(type(op))
    parts = []
    for k, v in op.attr_values().items():
        if k in ("axes", "dtype") and isinstance(op, og.TensorOp):
            continue
        if k in defaults and not callable(v) and value_key(v) == value_key(defaults[k]):
            continue
        parts.append(f"{k}={show_value(v)}")
    return ", ".join(parts)


def _type(op):
    return f"{show_axes(op.axes)} {op.dtype}" if isinstance(op, og.TensorOp) else "void"


def _deps(op, lowered):
    """``(args, other_deps)`` of ``op`` as printed: as built, or the live ops."""
    if lowered:
        return [og.snap(a) for a in op.args], [og.snap(d) for d in op.other_deps]
    return op.as_built()


def _graph(results, lowered):
    """The ops to print for ``results``, each after its dependencies."""
    if lowered:
        return graph_ops(results)
    # The graph as built: passes rewire a user's ops only after keeping what they were
    # built with (Node.as_built), so walking that shows the user's graph.

    def children(op):
        args, deps = op.as_built()
        return tuple(args) + tuple(deps)
    order = og.toposort(results, children=children)
    seen = set(order)
    while True:
        extra = [i for op in order for i in op._initializers if i not in seen]
        if not extra:
            return order
        more = [op for op in og.toposort(dict.fromkeys(extra), children=children)
                if op not in seen]
        order.extend(more)
        seen.update(more)


def op_line(op, labels=None, full_paths=False, lowered=False):
    """The text line of one op (see the module docstring); ``lowered``: its live args
    (following ``forward``) instead of those it was built with."""
    labels = labels or {}

    def ref(x):
        return labels.get(x, x.name)
    args, deps = _deps(op, lowered)
    args = ", ".join(ref(a) for a in args)
    attrs = describe_attrs(op)
    inside = args + ("; " if args and attrs else "") + attrs
    line = f"{labels.get(op, op.name)} = {type(op).__name__}({inside}) : {_type(op)}"
    if deps:
        line += " after [" + ", ".join(ref(d) for d in deps) + "]"
    if op.tags:
        line += " {" + ", ".join(sorted(map(str, op.tags))) + "}"
    line += f"  # {_location(op, full_paths)}"
    if op.derived_from:
        line += f" <- {op.derived_from}"
    return line


def graph_text(ops: Union[og.Op, Sequence[og.Op]], full_paths: bool = False,
               lowered: bool = False) -> str:
    """The graph that ``ops`` (an op or a list) need, one line per op (see the module
    docstring), args first; ``full_paths`` prints whole file names, not base names.

    It shows the ops as they were built, also after a transformer compiled them (its
    passes rewire ops and set ``forward``, but a user's graph reads as the user wrote
    it). ``lowered=True`` follows ``forward`` instead: the ops that compute the values
    now (see also :func:`graph_after`)."""
    results = og.as_op_list(ops, "ops")[0]
    if lowered:
        results = [og.snap(r) for r in results]
    order = _graph(results, lowered)
    labels = _labels(order)
    head = f"# {len(order)} ops; results: " + ", ".join(labels[r] for r in results)
    return "\n".join([head] + [op_line(op, labels, full_paths, lowered)
                               for op in order]) + "\n"


def dump(ops, title="graph", file=None):
    """Print ``graph_text(ops, lowered=True)`` (the graph as a pass left it) under a
    ``# title`` line to ``file`` (default stderr)."""
    file = sys.stderr if file is None else file
    print(f"# {title}\n{graph_text(ops, lowered=True)}", end="", file=file)


def graph_after(ops: Union[og.Op, Sequence[og.Op]], pass_name: str,
                transformer: Any = None) -> str:
    """The text of the graph of ``ops`` after the transformer's pass ``pass_name``.

    Works on a copy (``clone_graph``): ``ops`` are not
    transformed. ``transformer`` is a transformer instance (default: a new ``"numpy"``
    transformer from :func:`geon.make_transformer`); its disabled passes are skipped as
    in a real computation.
    """
    if transformer is None:
        transformer = make_transformer("numpy")
    results, _ = og.as_op_list(ops, "graph_after: ops")
    mapping = clone_graph(results)
    return graph_text(transformer.transform([mapping[og.snap(r)] for r in results],
                                            stop_after=pass_name), lowered=True)


# --- DOT ----------------------------------------------------------------------------------

def _dot_quote(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _shape(op):
    if isinstance(op, og.Placeholder):
        return "invhouse"
    if isinstance(op, og.Variable):
        return "cylinder"
    if isinstance(op, og.Constant):
        return "note"
    if isinstance(op, og.VoidOp):
        return "octagon"
    return "box"


def graph_dot(ops: Union[og.Op, Sequence[og.Op]], full_paths: bool = False,
              name: str = "geon", lowered: bool = False) -> str:
    """The graph of ``ops`` in graphviz's DOT language.

    Each op is a node labelled with its name, type, attributes, axes and dtype, and
    source location; an edge runs from each arg to its user (labelled with the arg's
    position when there are several) and a dashed edge from each other_dep. Render it
    with graphviz (``dot -Tsvg graph.dot -o graph.svg``) or ``render_dot``. As
    :func:`graph_text`, it shows the ops as built unless ``lowered=True``.
    """
    results = og.as_op_list(ops, "ops")[0]
    if lowered:
        results = [og.snap(r) for r in results]
    order = _graph(results, lowered)
    labels = _labels(order)
    ids = {op: f"n{i}" for i, op in enumerate(order)}
    lines = [f"digraph {_dot_quote(name)} {{",
             '  node [fontname="monospace", fontsize=10];',
             '  edge [fontname="monospace", fontsize=9];']
    for op in order:
        attrs = describe_attrs(op)
        text = f"{labels[op]}\n{type(op).__name__}" + (f"({attrs})" if attrs else "") \
            + f"\n{_type(op)}\n{_location(op, full_paths)}"
        if op.derived_from:
            text += f"\n<- {op.derived_from}"
        extra = ", penwidth=2" if op in results else ""
        lines.append(f"  {ids[op]} [label={_dot_quote(text)}, shape={_shape(op)}{extra}];")
    for op in order:
        args, deps = _deps(op, lowered)
        for i, a in enumerate(args):
            label = f" [label=\"{i}\"]" if len(args) > 1 else ""
            lines.append(f"  {ids[a]} -> {ids[op]}{label};")
        for d in deps:
            lines.append(f"  {ids[d]} -> {ids[op]} [style=dashed];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_dot(dot_text, path, format=None):
    """Render DOT text to ``path`` with graphviz's ``dot`` program (``format`` defaults
    to the file's extension, e.g. ``svg`` or ``png``). graphviz is optional: without
    it this raises :class:`GeonError`; :func:`graph_dot` itself never needs it."""
    exe = shutil.which("dot")
    if exe is None:
        raise GeonError("rendering needs graphviz's 'dot' program, which is not "
                        "installed; write the DOT text to a file and render it elsewhere")
    fmt = format or os.path.splitext(os.fspath(path))[1].lstrip(".") or "svg"
    run = subprocess.run([exe, f"-T{fmt}", "-o", os.fspath(path)], input=dot_text,
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise GeonError(f"dot failed: {run.stderr.strip()}")
