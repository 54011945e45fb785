"""The guide's pictures, made from geon itself when the guide is built.

* ``readme_before`` / ``readme_after``: the README example's graph as built and after
  the NumPy transformer lowered it (:func:`geon.graph_dot`, rendered by graphviz);
* ``passes``: the pass pipeline, read from the transformer's ``passes()`` and
  ``backend_steps`` (rendered by graphviz);
* ``digits_memory``: the arena bytes live at each step of the digits example's training
  computation, from the NumPy transformer's memory plan (SVG written here, no plotting
  library).

A page shows one with ``.. geon-figure:: NAME`` (the directive's content is the
caption). Where graphviz's ``dot`` is not installed (or fails), the SVGs committed
under ``doc/_figures/`` are used instead; regenerate those with
``python doc/_ext/geon_figures.py doc/_figures``.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOC = HERE.parent
ROOT = DOC.parent
FALLBACK = DOC / "_figures"
#: Figures rendered by graphviz (committed fallbacks exist for these).
DOT_FIGURES = ("readme_before", "readme_after", "passes")
#: Figures drawn here as SVG (always made).
SVG_FIGURES = ("digits_memory",)
FIGURES = DOT_FIGURES + SVG_FIGURES
#: Where, under the HTML output, the pictures are.
STATIC_DIR = "geon_figures"


# --- the pictures ----------------------------------------------------------------------

def readme_graph():
    """The README example's computation (the first ``python`` block of README.md,
    compiled with the README's file name and line numbers, so that the op labels
    point at README lines). Its output (``print(step.source)``) is discarded."""
    import contextlib
    import io
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"^```python\n(.*?)^```", text, re.M | re.S)
    first = text[:m.start(1)].count("\n")
    ns = {"__name__": "readme_example"}
    code = compile("\n" * first + m.group(1), "README.md", "exec")
    with contextlib.redirect_stdout(io.StringIO()):
        exec(code, ns)
    return ns["step"]


def readme_dots():
    """``(before, after)``: DOT text of the README step's graph as built and lowered."""
    import geon as be
    step = readme_graph()
    return (be.graph_dot(step.requested, name="README example"),
            be.graph_dot(step.requested, name="README example, lowered", lowered=True))


def passes_dot():
    """DOT text of the NumPy transformer's pipeline: its passes in order (``layout``
    dashed: only with a ``sample_axis`` preference; passes that cannot be disabled in
    bold), then the backend's steps."""
    import geon as be
    plain = [p.name for p in be.NumPyTransformer().passes()]
    t = be.NumPyTransformer(sample_axis="first")
    required = getattr(t, "_required", set())
    lines = ['digraph "pass pipeline" {', "  rankdir=TB; nodesep=0.2; ranksep=0.2;",
             '  node [fontname="sans-serif", fontsize=10, shape=box, style=rounded];',
             '  edge [arrowsize=0.6];',
             '  graph_in [label="graph as built", shape=plaintext];']
    prev = "graph_in"
    for i, p in enumerate(t.passes()):
        style = ["rounded"] + (["dashed"] if p.name not in plain else []) \
            + (["bold"] if p.name in required else [])
        note = "\\n(with sample_axis)" if p.name not in plain else ""
        lines.append(f'  p{i} [label="{p.name}\\n{type(p).__name__}{note}", '
                     f'style="{",".join(style)}"];')
        lines.append(f"  {prev} -> p{i};")
        prev = f"p{i}"
    steps = ["schedule"] + list(type(t).backend_steps) + ["generate NumPy code"]
    for j, s in enumerate(steps):
        lines.append(f'  b{j} [label="{s}", shape=box, style="rounded,filled", '
                     f'fillcolor="#eeeeee"];')
        lines.append(f"  {prev} -> b{j};")
        prev = f"b{j}"
    lines.append("}")
    return "\n".join(lines) + "\n"


def memory_occupancy(comp):
    """``(live, arena_total, unshared_total)`` for a NumPy computation: ``live[i]``
    is the number of arena bytes holding a value still needed at step ``i`` of its
    schedule (per arena, the largest such value); the sum of the arena sizes; and the
    bytes one buffer per value would take."""
    from geon.op_graph import op_graph as og
    from geon.transformers import memory
    order, plan = comp.order, comp.plan
    root = memory.value_roots(order)
    pos = {op: i for i, op in enumerate(order)}
    last = {}
    for i, op in enumerate(order):
        for a in op.args:
            last[root.get(a, a)] = i
    spans = {}
    for value, arena in plan.slot.items():
        start = pos.get(value)
        if isinstance(value, og.Output):
            start = pos.get(value.args[0], start) if value.args else start
        if start is None:
            continue
        end = max(last.get(value, start), start)
        spans.setdefault(arena, []).append((start, end, value.axes.size * value.dtype.itemsize))
    live = []
    for i in range(len(order)):
        live.append(sum(max((b for s, e, b in vs if s <= i <= e), default=0)
                        for vs in spans.values()))
    unshared = sum(v.axes.size * v.dtype.itemsize for v in plan.slot)
    return live, sum(plan.sizes), unshared


def digits_step():
    """The digits example's training computation (batch 32), on the NumPy transformer."""
    from geon.examples import digits
    model = digits.build_model(dict(digits.HYPERPARAMETERS), 64, "numpy")
    return model.train_computation(digits.HYPERPARAMETERS["batch_size"])


def _kib(n):
    return f"{n / 1024:.0f} KiB" if n >= 1024 else f"{n} B"


#: Estimated width of a character of the figures' sans-serif text, in ems (generous:
#: the average of a proportional font is nearer 0.55); used to lay out the legend.
CHAR_EM = 0.62


def text_width(text, size):
    """Estimated width in pixels of ``text`` at font size ``size``."""
    return len(text) * size * CHAR_EM


def _nice_step(top, ticks=5):
    """The smallest round tick step (1, 2 or 5 times a power of ten) that covers
    ``top`` in at most ``ticks`` steps."""
    step = 1
    while step * ticks < top:
        for m in (2, 2.5, 2):  # 1, 2, 5, 10, 20, 50, 100 ...
            step = int(step * m)
            if step * ticks >= top:
                break
    return step


def memory_svg(live, arena_total, unshared_total, title):
    """A step plot of ``live`` over the schedule, with the arena total and the
    unshared total as dashed reference lines, as SVG text. The lines are named in a
    legend below the plot, so that no label lies on a line."""
    w, left, right, top = 640, 70, 20, 40
    ph, pw = 190, 640 - 70 - 20
    size = 11
    n = max(len(live), 1)
    peak = max(live, default=0)
    highest = max([unshared_total, arena_total, 1] + list(live))
    unit = 1024 if highest >= 4 * 1024 else 1
    step = _nice_step(highest * 1.05 / unit) * unit   # headroom above the highest line
    top_value = step * -(-highest * 1.05 // step)

    def x(i):
        return left + pw * i / n

    def y(v):
        return top + ph * (1 - v / top_value)

    # The legend: one entry per line (a sample of the line, then its label), laid out
    # in rows below the axis title, a row wrapping when the next entry would not fit.
    entries = [("#222", None, f"bytes live in arenas (peak {_kib(peak)})"),
               ("#48c", "5,4", f"arenas allocated: {_kib(arena_total)}"),
               ("#c44", "5,4", f"one buffer per value: {_kib(unshared_total)}")]
    swatch, gap, spacing, row_h = 24, 6, 28, 18
    rows, cx = [[]], left
    for entry in entries:
        width = swatch + gap + text_width(entry[2], size)
        if rows[-1] and cx + width > w - right:
            rows.append([])
            cx = left
        rows[-1].append((cx, entry))
        cx += width + spacing
    legend_top = top + ph + 54
    h = int(legend_top + row_h * len(rows) + 4)

    pts = []
    for i, v in enumerate(live):
        pts += [f"{x(i):.1f},{y(v):.1f}", f"{x(i + 1):.1f},{y(v):.1f}"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="{size}">',
           f"<title>{title}</title>",
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" '
           f'stroke="#999"/>',
           f'<text x="{w / 2}" y="18" text-anchor="middle" font-size="13">{title}</text>']
    v = 0
    while v <= top_value:
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">'
                   f'{_kib(int(v))}</text>')
        v += step
    for k in range(6):
        i = round(n * k / 5)
        out.append(f'<text x="{x(i):.1f}" y="{top + ph + 16}" text-anchor="middle">'
                   f'{i}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{top + ph + 32}" text-anchor="middle">'
               f'schedule position (step of the generated code)</text>')
    for colour, dash, _ in entries[1:]:
        value = arena_total if colour == "#48c" else unshared_total
        out.append(f'<line x1="{left}" y1="{y(value):.1f}" x2="{left + pw}" '
                   f'y2="{y(value):.1f}" stroke="{colour}" stroke-dasharray="{dash}"/>')
    out.append(f'<polyline fill="none" stroke="#222" stroke-width="1.5" '
               f'points="{" ".join(pts)}"/>')
    for r, row in enumerate(rows):
        ly = legend_top + r * row_h
        for cx, (colour, dash, label) in row:
            style = f' stroke-dasharray="{dash}"' if dash else ' stroke-width="1.5"'
            out.append(f'<line x1="{cx:.1f}" y1="{ly - 4:.1f}" x2="{cx + swatch:.1f}" '
                       f'y2="{ly - 4:.1f}" stroke="{colour}"{style}/>')
            out.append(f'<text x="{cx + swatch + gap:.1f}" y="{ly:.1f}" '
                       f'fill="{colour}">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def render_svg(dot_text):
    """SVG text of ``dot_text`` rendered by graphviz, or ``None`` without it."""
    exe = shutil.which("dot")
    if exe is None:
        return None
    run = subprocess.run([exe, "-Tsvg"], input=dot_text, capture_output=True, text=True)
    if run.returncode != 0:
        return None
    # Drop graphviz's version comment so the output does not depend on it.
    return re.sub(r"<!-- Generated by graphviz[^>]*-->\n", "", run.stdout)


def _write(path, text):
    """Write ``text`` to ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def make_figures(out_dir, fallback=FALLBACK):
    """Write every figure as ``out_dir/NAME.svg``; return ``{name: "generated" or
    "fallback"}``. A graphviz figure that cannot be rendered is copied from
    ``fallback`` (``None``: raise instead)."""
    out_dir = Path(out_dir)
    before, after = readme_dots()
    dots = {"readme_before": before, "readme_after": after, "passes": passes_dot()}
    how = {}
    for name in DOT_FIGURES:
        svg = render_svg(dots[name])
        if svg is None:
            if fallback is None:
                raise RuntimeError(f"could not render {name} with graphviz's dot")
            svg = (Path(fallback) / f"{name}.svg").read_text(encoding="utf-8")
            how[name] = "fallback"
        else:
            how[name] = "generated"
        _write(out_dir / f"{name}.svg", svg)
    live, arena_total, unshared_total = memory_occupancy(digits_step())
    _write(out_dir / "digits_memory.svg",
           memory_svg(live, arena_total, unshared_total,
                      "digits training step: memory plan"))
    how["digits_memory"] = "generated"
    return how


# --- Sphinx --------------------------------------------------------------------------

def _builder_inited(app):
    if app.builder.format != "html":
        return
    from sphinx.util import logging
    out = Path(app.doctreedir) / STATIC_DIR / STATIC_DIR
    how = make_figures(out)
    used = [n for n, h in how.items() if h == "fallback"]
    if used:
        logging.getLogger(__name__).info(
            f"geon_figures: graphviz's dot is not available; committed SVGs used for "
            f"{', '.join(used)}")
    # Copied to _static/geon_figures/ with the other static files.
    app.config.html_static_path = list(app.config.html_static_path) + [str(out.parent)]


def setup(app):
    from docutils import nodes
    from docutils.parsers.rst import directives
    from sphinx.util.docutils import SphinxDirective

    class GeonFigure(SphinxDirective):
        """``.. geon-figure:: NAME`` with ``:alt:``; the content is the caption."""
        required_arguments = 1
        has_content = True
        option_spec = {"alt": directives.unchanged}

        def run(self):
            name = self.arguments[0]
            if name not in FIGURES:
                raise self.error(f"unknown geon figure {name!r}; known: {FIGURES}")
            depth = self.env.docname.count("/")
            src = "../" * depth + f"_static/{STATIC_DIR}/{name}.svg"
            alt = self.options.get("alt", name).replace('"', "&quot;")
            box = nodes.container(classes=["geon-figure"])
            box += nodes.raw("", f'<a href="{src}"><img src="{src}" alt="{alt}" '
                             f'class="geon-figure" style="max-width: 100%"/></a>',
                             format="html")
            if self.content:
                caption = nodes.container(classes=["geon-figure-caption"])
                self.state.nested_parse(self.content, self.content_offset, caption)
                box += caption
            return [box]

    app.add_directive("geon-figure", GeonFigure)
    app.connect("builder-inited", _builder_inited)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":  # regenerate the committed fallbacks
    sys.path.insert(0, str(ROOT))
    print(make_figures(sys.argv[1] if len(sys.argv) > 1 else FALLBACK, fallback=None))
