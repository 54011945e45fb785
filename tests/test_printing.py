"""Graph printing: the text dump of user and lowered graphs (with source lines) and the
DOT output."""

import inspect
import io
import re
import shutil
import sys

import numpy as np
import pytest

import geon as be
from geon.op_graph import op_graph as og
from geon.op_graph import printing

C = be.Axis(3, "C")
H = be.Axis(4, "H")
N = be.Axis(5, "N", batch=True)


def line_of(marker):
    for i, text in enumerate(inspect.getsource(sys.modules[__name__]).splitlines(), 1):
        if marker in text and "line_of(" not in text:
            return i
    raise AssertionError(marker)


def model():
    x = be.placeholder((C, N), name="x")
    w = be.Variable((H, C), initial_value=0.5, name="w")
    h = be.tanh(be.dot(w, x))  # MARK-dot
    s = be.sum(h, reduction_axes=H)  # MARK-sum
    upd = be.SetItem(w, w - 0.1)  # MARK-set
    return x, w, h, s, upd


def lines_by_name(text):
    out = {}
    for ln in text.splitlines()[1:]:
        out[ln.split(" = ", 1)[0]] = ln
    return out


def test_text_of_the_user_graph():
    x, w, h, s, upd = model()
    text = be.graph_text([s, upd])
    first, *rest = text.splitlines()
    assert first == f"# {len(rest)} ops; results: {s.name}, {upd.name}"
    lines = lines_by_name(text)
    me = "test_printing.py"
    assert lines["x"] == f"x = Placeholder() : (C:3, N:5) float32 {{in}}  # {me}:" \
                         f"{x.lineno}"
    assert lines["w"].startswith("w = Variable(initial_value=0.5) : (H:4, C:3) float32")
    dot = h.args[0]
    assert lines[dot.name] == (f"{dot.name} = Dot(w, x) : (H:4, N:5) float32  # {me}:"
                               f"{line_of('MARK-dot')}")
    assert lines[s.name] == (f"{s.name} = Sum({h.name}; reduction_axes=(H:4)) : (N:5) "
                             f"float32  # {me}:{line_of('MARK-sum')}")
    assert lines[upd.name].startswith(f"{upd.name} = SetItem(w, ")
    assert f": void  # {me}:{line_of('MARK-set')}" in lines[upd.name]
    # One line per op, args before users.
    names = list(lines)
    assert names.index("w") < names.index(dot.name) < names.index(h.name) < names.index(s.name)
    # Whole paths on request.
    assert f"# {__file__}:{line_of('MARK-sum')}" in be.graph_text(s, full_paths=True)


def test_attributes_deps_tags_and_constants():
    x = be.placeholder((C, H, N), name="x", dtype=np.float64)
    sl = be.slice_along_axis(x, H, slice(1, 3))
    k = be.Constant(np.arange(3.0), axes=C, name="k")
    w = be.Variable((C,), initial_value=lambda s: np.ones(s), name="wf", trainable=False)
    y = og.Tanh(be.sum(sl, reduction_axes=sl.axes[1]) * k * w, name="out", tags={"act"})
    upd = be.SetItem(w, w + 1)
    later = be.exp(w)
    text = be.graph_text([y, upd, later])
    lines = lines_by_name(text)
    assert "Slice(x; axis=H:4, key=1:3:, new_axis=H[1:3:]:2) : (C:3, H[1:3:]:2, N:5) " \
        "float64" in lines[sl.name]
    assert lines["k"].startswith("k = Constant(value=[0., 1., 2.]) : (C:3) float64")
    assert lines["wf"].startswith("wf = Variable(initial_value=<function>, trainable=False)")
    assert " {act}  # " in lines["out"]
    assert f"after [{upd.name}]" in lines[later.name]
    assert "Constant(value=1, weak=True) : () float32" in text


def test_duplicate_names_are_numbered():
    a = be.placeholder((C,), name="dup")
    b = be.placeholder((C,), name="dup")
    text = be.graph_text(a + b)
    assert "dup#1 = Placeholder()" in text and "dup#2 = Placeholder()" in text
    assert "Add(dup#1, dup#2)" in text


def test_lowered_graph_after_a_named_pass_shows_the_user_lines():
    x, w, h, s, upd = model()
    dot_name, sum_name = h.args[0].name, s.name
    out = io.StringIO()
    t = be.NumPyTransformer(dump_after=["lower", "fold"], dump_file=out)
    t.computation(s, x)
    text = out.getvalue()
    assert text.startswith("# after pass lower\n# ")
    assert "# after pass fold\n" in text
    lowered = text.split("# after pass fold\n")[1]
    gemm = [ln for ln in lowered.splitlines() if " = Gemm(" in ln]
    assert len(gemm) == 1
    assert gemm[0].endswith(f"# test_printing.py:{line_of('MARK-dot')} <- Dot {dot_name}")
    red = [ln for ln in lowered.splitlines() if " = ReduceSum(" in ln]
    assert red and red[0].endswith(f"# test_printing.py:{line_of('MARK-sum')} <- Sum "
                                   f"{sum_name}")
    assert " = Dot(" not in lowered and " = Sum(" not in lowered
    with pytest.raises(ValueError, match="dump_after: unknown pass name"):
        be.NumPyTransformer(dump_after=["lowr"])


def test_graph_after_works_on_a_copy():
    x, w, h, s, upd = model()
    dot = h.args[0]
    text = be.graph_after(s, "lower")
    assert re.search(r" = Gemm\(w, x\) : \(H:4, N:5\) float32  # test_printing.py:\d+ "
                     rf"<- Dot {dot.name}", text)
    assert dot.forward is None and h.args == (dot,)   # the user's graph is unchanged
    assert "Dot(w, x)" in be.graph_text(s)
    assert "ReduceSum" in be.graph_after(s, "verify")
    with pytest.raises(ValueError, match="unknown pass name 'nope'"):
        be.graph_after(s, "nope")


def test_dot_output():
    x, w, h, s, upd = model()
    odd = og.Exp(x, name='say "hi"\\')
    dot = be.graph_dot([s, upd, odd])
    assert dot.startswith('digraph "geon" {') and dot.rstrip().endswith("}")
    nodes = re.findall(r"^  (n\d+) \[label=", dot, re.M)
    edges = re.findall(r"^  (n\d+) -> (n\d+)", dot, re.M)
    order = printing.graph_ops([s, upd, odd])
    assert len(nodes) == len(order)
    assert len(edges) == sum(len(op.args) + len(op.other_deps) for op in order)
    assert 'label="say \\"hi\\"\\\\\\nExp' in dot
    assert f"test_printing.py:{line_of('MARK-dot')}" in dot
    assert "shape=invhouse" in dot and "shape=cylinder" in dot and "shape=octagon" in dot
    assert '[label="0"]' in dot and '[label="1"]' in dot


def test_dot_after_lowering_has_dashed_dependency_edges():
    w = be.Variable((C,), initial_value=1.0, name="wd")
    upd = be.SetItem(w, w + 1)
    after = w * 2
    dot = be.graph_dot([upd, after])
    assert "style=dashed" in dot


def test_render_dot_without_graphviz(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(be.GeonError, match="graphviz"):
        printing.render_dot(be.graph_dot(be.placeholder((C,))), tmp_path / "g.svg")


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz is not installed")
def test_render_dot_with_graphviz(tmp_path):
    path = tmp_path / "g.svg"
    printing.render_dot(be.graph_dot(be.tanh(be.placeholder((C,)))), path)
    assert path.read_text().lstrip().startswith("<")


def test_compiling_leaves_the_printed_graph_as_built():
    x = be.placeholder((C, N), name="x")
    w = be.Variable(axes=[C], initial_value=0.5, name="w")
    h = be.tanh(x * 1.0)  # simplification rewires h to read x directly
    h.name = "h"
    s = be.sum(h * w, out_axes=())
    upd = be.SetItem(w, w + 1.0)
    later = w * 2.0  # ordered after the SetItem
    text, dot = be.graph_text([s, upd, later]), be.graph_dot([s, upd, later])
    assert "h = Tanh(Multiply_" in text and "after [SetItem_" in text
    f = be.NumPyTransformer().computation([s, upd, later], x)
    assert be.snap(s) is not s and type(be.snap(s)).__name__ == "ReduceSum"
    assert be.graph_text([s, upd, later]) == text
    assert be.graph_dot([s, upd, later]) == dot
    lowered = be.graph_text([s, upd, later], lowered=True)
    assert "ReduceSum(" in lowered and "h = Tanh(x)" in lowered and " Sum(" not in lowered
    assert "ReduceSum(" in be.graph_dot(s, lowered=True)
    # values still follow the lowered ops
    X = np.linspace(0, 1, 15).reshape(3, 5)
    got, _, twice = f(X)
    np.testing.assert_allclose(got, (np.tanh(X) * 0.5).sum(), rtol=1e-6)
    np.testing.assert_allclose(twice, np.full(3, 3.0))
