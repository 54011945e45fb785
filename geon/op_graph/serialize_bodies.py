"""Control-flow bodies in documents: a body (a scan's, a branch of a cond, a while
loop's predicate or body) is written inside its op's record as a *nested graph*::

    {"inputs": n, "ops": [op records], "results": [[id, output], ...]}

in the record format of the document's top level (see ``doc/interchange.rst``): ops
``0 .. n-1`` are its stand-in placeholders, in the order of the op's args, and its
records refer to its own ops by their own ids (from 0) and to the document's axes. A
body reads only its stand-ins and constants (an outer op it needs is an arg of its op,
read through a stand-in), so its records can refer to nothing else: a placeholder that
is not a stand-in, a variable or an assignment in a body is an error, on writing and on
reading. The bodies of one op share their stand-ins (a cond's branches, a while loop's
predicate and body): each lists them alike, and a reader makes them once per op.

A body type's codec (:func:`~geon.op_graph.serialize.register_codec`, in the module
defining it) writes its nested graph with :func:`write_body` and reads it with
:func:`read_body`; that module names the attributes of its op classes that hold bodies
in :data:`BODY_ATTRS` (a body anywhere else in a document is an error). Reading builds
every op through its constructor, as at the top.
"""

from typing import Any, Sequence

from geon.errors import GeonError
from geon.op_graph import op_graph as og
from geon.op_graph.params import graph_ops
from geon.op_graph.serialize import (MAX_BODY_DEPTH, _Decoder, _dict, _fail, _int, _list,
                                     _out_index, _record, read_graph)

__all__ = ["BODY_ATTRS", "read_body", "write_body"]

#: op class -> the names of its attributes that hold bodies (or tuples of bodies)
BODY_ATTRS: dict = {}


def _refused(op):
    """Why ``op`` may not be in a body (``None``: it may)."""
    if isinstance(op, og.Placeholder):
        return "a placeholder that is not one of the body's stand-ins"
    if isinstance(op, og.AssignableTensorOp) and not op.is_constant:
        return f"a {type(op).__name__}, which a body cannot hold (it reads stored values " \
               f"through a stand-in)"
    if not isinstance(op, (og.TensorOp, og.MultiOutput)):
        return "an assignment, which a body cannot hold"
    return None


def write_body(enc: Any, inputs: Sequence[og.Op], results: Sequence[og.Op],
               where: str) -> dict:
    """The nested graph of the body computing ``results`` from the stand-ins ``inputs``,
    written by ``enc`` (the encoder writing the body's op)."""
    if enc.body_depth >= MAX_BODY_DEPTH:
        raise _fail(where, f"bodies nest more than {MAX_BODY_DEPTH} deep")
    inputs, results = list(inputs), list(results)
    if enc.stand_ins is None:
        enc.stand_ins = inputs
    elif len(inputs) != len(enc.stand_ins) or any(
            a is not b for a, b in zip(inputs, enc.stand_ins)):
        raise _fail(where, "the bodies of one op must share their stand-ins (the same "
                           "placeholders, in the same order)")
    for k, p in enumerate(inputs):
        if not isinstance(p, og.Placeholder) or any(q is p for q in inputs[:k]):
            raise _fail(where, f"stand-in {k} ({p.name}) is not a placeholder of its own")
    for j, r in enumerate(results):
        if not isinstance(og.snap(r), og.TensorOp):
            raise _fail(where, f"result {j} ({r.name}) is not a tensor")
    try:
        order = graph_ops(results)
    except GeonError as e:
        raise _fail(where, str(e)) from None
    stand_ins = {id(p) for p in inputs}
    rest = [op for op in order if id(op) not in stand_ins and not isinstance(op, og.Output)]
    for op in rest:
        why = _refused(op)
        if why is not None:
            raise _fail(where, f"the body reads {op.name}, {why}")
    written = inputs + rest
    ids = {op: i for i, op in enumerate(written)}
    ids.update((op, ids[og.snap(op.args[0])]) for op in order if isinstance(op, og.Output))
    inner = enc.nested(ids, f"{where}, ")
    records = [_record(op, ids[op], inner) for op in written]
    enc.root.wrote_body = True
    return {"inputs": len(inputs), "ops": records,
            "results": [[ids[og.snap(r)], _out_index(og.snap(r))] for r in results]}


class _BodyDecoder(_Decoder):
    """Reads a body's records: ops ``0 .. n_inputs-1`` are its stand-ins (those of its
    op's first body, ``shared``, when it has one)."""

    def __init__(self, parent, prefix, n_inputs, shared):
        super().__init__(parent=parent, prefix=prefix)
        self.n_inputs, self.shared = n_inputs, shared

    def add(self, op, where):
        k = len(self.ops)
        if k < self.n_inputs:
            if not isinstance(op, og.Placeholder):
                raise _fail(where, f"ops 0..{self.n_inputs - 1} of a body are its "
                                   f"stand-ins, each a Placeholder")
            if self.shared is not None:
                s = self.shared[k]
                if s.axes.names != op.axes.names or s.axes.lengths != op.axes.lengths \
                        or s.dtype != op.dtype:
                    raise _fail(where, f"differs from stand-in {k} of its op's first body "
                                       f"({s.name}); the bodies of one op share their "
                                       f"stand-ins")
                op = s
        else:
            why = _refused(op)
            if why is not None:
                raise _fail(where, f"{why}: a body reads only its stand-ins (ops "
                                   f"0..{self.n_inputs - 1}) and constants")
        return super().add(op, where)


def read_body(dec: Any, data: Any, where: str, counts: Sequence[str] = ()) -> tuple:
    """``(stand-ins, results, count values)`` of the nested graph ``data`` at ``where``,
    read by ``dec`` (the decoder reading the body's op); ``counts`` are the names of
    further keys of ``data`` holding integers >= 0 (a scan body's ``"carries"``, ...)."""
    if dec.version < 3:
        raise _fail(where, f"a body needs version 3 of the format; the document has "
                           f"version {dec.version}")
    if dec.body_depth >= MAX_BODY_DEPTH:
        raise _fail(where, f"bodies nest more than {MAX_BODY_DEPTH} deep")
    cls, attr = dec.reading or (None, None)
    if attr not in BODY_ATTRS.get(cls, ()):
        raise _fail(where, "a body may only be an attribute that holds one (" + ", ".join(
            f"{c.__name__}.{a}" for c, names in BODY_ATTRS.items() for a in names) + ")")
    keys = ("inputs", "ops", "results", *counts)
    _dict(data, where, set(keys), keys)
    values = [_int(data[k], f"{where}.{k}", 0) for k in counts]
    records = _list(data["ops"], f"{where}.ops")
    n = _int(data["inputs"], f"{where}.inputs", 0)
    if n > len(records):
        raise _fail(f"{where}.inputs", f"{n} stand-ins, but the body has only "
                                       f"{len(records)} ops")
    shared = dec.stand_ins
    if shared is not None and n != len(shared):
        raise _fail(f"{where}.inputs", f"{n} stand-ins, but its op's first body has "
                                       f"{len(shared)}; the bodies of one op share their "
                                       f"stand-ins")
    inner = _BodyDecoder(dec, f"{where}.", n, shared)
    read_graph(inner, records)
    inputs = inner.ops[:n]
    if shared is None:
        dec.stand_ins = inputs
    inner.limit = len(records)
    results = [inner.ref(r, f"{where}.results[{j}]")
               for j, r in enumerate(_list(data["results"], f"{where}.results"))]
    return inputs, results, values
