"""Text from a graph never becomes code (geon/transformers/codegen_text.py).

Names, source locations, ``derived_from`` strings, tags and user-op parameters of a
graph, whether built in Python, given to ``be.run`` or loaded with ``be.deserialize``,
are set to strings that would run code if they reached generated Python or CUDA C
unescaped (it would create a marker file or set a flag in ``builtins``), and to strings
that would break compilation (NUL, lone surrogates, line breaks, ``*/``, a backslash
at the end of a C++ line comment, a trigraph). The graphs compile and run on the NumPy
transformer and on the GPU code generator (``nvcc -ptx``, skipped without nvcc; the CPU
emulator, skipped without a C++ compiler), give the values of the same graph with
plain names, and nothing runs.
"""

import builtins
import ctypes
import hashlib
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import geon as be
from geon.transformers.codegen_text import RESERVED, comment, identifier, py_literal
from geon.transformers.gpu import CudaCodegenTransformer, GPUTransformer
from test_gpu_codegen import CXX, NVCC, EmulatorRuntime

FLAG = "geon_pwned"


def hostile_strings(marker):
    """Strings that run code if pasted unescaped into generated Python (at any
    indentation the generators use) or C++, and strings that break compilation."""
    py = (f"__import__('os').system('touch {marker}'); "
          f"setattr(__import__('builtins'), '{FLAG}', 1)")
    c = f'static int {FLAG} = system("touch {marker}");'
    out = []
    for indent in ("", "    ", "        ", "            "):
        for nl in ("\n", "\r", "\r\n"):
            out.append(f"x{nl}{indent}{py}{nl}{indent}#")
    # on one line: code where a name is pasted as an identifier or an expression
    out += [f"x=__import__('os').system('touch {marker}')",
            f'x); system("touch {marker}"); (x']
    out += [f'x"""\n    {py}\n    """', f"x'\n    {py}\n    '", f"x\n{c}\n//",
            f"x */\n{c}\n/* ", f"x\\\n{c}", "x\\", "\\", "??/", "x??/", "a\x00b", "\x00",
            "x\ud800", "\udfff", "\u00f1", "\ufb01", "'", '"', '"""', "*/", "/*",
            "\x0c\x0b\t", "\u2028" + py, "\u540d\u524d"]
    return out


@pytest.fixture
def marker(tmp_path):
    """The path hostile strings would create; checks afterwards that nothing ran."""
    path = tmp_path / "ran"
    yield str(path)
    assert not path.exists(), "a string from the graph ran as code"
    assert not hasattr(builtins, FLAG), "a string from the graph ran as code"


# --- the helpers ------------------------------------------------------------------------

def test_identifiers_are_ascii_unique_and_never_shadow():
    taken = {"np", "run"}
    texts = hostile_strings("/tmp/m") + ["fi", "min", "range", "np", "run", "_i", "if",
                                         "__builtins__", "None", "1x", "x" * 500, "slice"]
    names = [identifier(t, taken) for t in texts]
    assert len(set(names)) == len(names)
    for n in names:
        assert n.isascii() and n.isidentifier() and n[0].isalpha(), n
        assert n not in RESERVED and n not in ("np", "run")
    assert identifier("x_y", set()) == "x_y"  # ordinary names read as written


def test_comments_are_printable_ascii_and_cannot_close():
    for t in hostile_strings("/tmp/m"):
        c = comment(t)
        assert all(" " <= ch <= "~" for ch in c), c
        assert "*/" not in c and "??" not in c and not c.endswith("\\"), c
    assert comment('Tanh <- Dot Dot_0, File "model.py", line 6') == \
        'Tanh <- Dot Dot_0, File "model.py", line 6'
    assert comment("a\nb\\") == "a\\x0ab\\x5c"


def test_literals_read_back():
    values = hostile_strings("/tmp/m") + [None, True, -3, 2.5, (1, "a\n", (None,)),
                                          slice(1, None, -2), (slice(None), 0, Ellipsis)]
    for v in values:
        text = py_literal(v)
        assert text.isascii() and "\n" not in text
        assert eval(text, {"__builtins__": {"slice": slice}}) == v
    assert np.isnan(eval(py_literal(float("nan")), {"float": float}))
    with pytest.raises(be.GeonError):
        py_literal(object())


# --- the graph --------------------------------------------------------------------------

Softplus = be.elementwise_op(
    "SoftplusHostileText", numpy=lambda x: np.logaddexp(0.0, x), derivative=be.sigmoid,
    cuda="__device__ float softplus_hostile(float x) { return log1pf(expf(-fabsf(x))) "
         "+ fmaxf(x, 0.0f); }")
LABELS = []  # the label parameter each call of Labelled received


def _labelled(x, label):
    LABELS.append(label)
    return x * 2.0


Labelled = be.define_op("LabelledHostileText", numpy=_labelled, params=("label",),
                        axes=lambda x, label: x.axes)
F, H, C, N = be.Axis(4, "F"), be.Axis(5, "H"), be.Axis(3, "C"), be.Axis(6, "N", batch=True)
rng = np.random.default_rng(5)
W1 = rng.standard_normal((5, 4)).astype(np.float32)
W2 = rng.standard_normal((3, 5)).astype(np.float32)
X = rng.standard_normal((4, 6)).astype(np.float32)
Y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 6)].T.copy()


class Model:
    """A small MLP (a user op with CUDA source, softmax, cross-entropy, SGD updates of
    its Variables) and ``extra`` more Variables with an update each. ``names``: an
    iterator of names for everything that takes one (``None``: the defaults).

    ``gpu``: the results the GPU transformer can run; ``results``: those and one more
    through a user op with a string parameter (its label; NumPy only)."""

    def __init__(self, names=None, extra=0):
        def nm():
            return None if names is None else next(names)
        x = self.x = be.placeholder((F, N), name=nm())
        y = self.y = be.placeholder((C, N), name=nm())
        w1 = be.Variable((H, F), initial_value=W1, name=nm())
        b1 = be.Variable(H, initial_value=0.1, name=nm())
        w2 = be.Variable((C, H), initial_value=W2, name=nm())
        h = Softplus(be.dot(w1, x) + b1, name=nm())
        p = be.softmax(be.dot(w2, h, name=nm()))
        cost = be.sum(be.cross_entropy_multi(p, y), out_axes=(), name=nm())
        self.variables = [w1, b1, w2] + [be.Variable(C, initial_value=float(k), name=nm())
                                         for k in range(extra)]
        steps = [be.SetItem(w, w - 0.1 * be.deriv(cost, w), name=nm())
                 for w in (w1, b1, w2)]
        steps += [be.SetItem(v, v * 0.5 + 1.0, name=nm()) for v in self.variables[3:]]
        self.label = "plain" if names is None else nm()
        tagged = be.sum(Labelled(h, label=self.label, name=nm()), out_axes=(), name=nm())
        self.gpu = [cost, p] + steps
        self.results = self.gpu + [tagged]


class Loaded:
    """A document of a :class:`Model`, loaded (the same attributes, but no label)."""

    def __init__(self, text):
        g = be.deserialize_graph(text)
        self.results = g.value
        self.gpu = self.results[:-1]
        self.x, self.y = sorted(g.placeholders, key=lambda p: p.axes.names[0] != "F")
        self.variables = g.variables


FIELDS = ("name", "loc", "derived_from", "tags", "params", "metadata")


def poison(text, strings, fields=FIELDS):
    """The document ``text`` with the string ``fields`` of every record set to the next
    of ``strings`` (cycled)."""
    doc = json.loads(text)
    it = itertools.cycle(strings)
    for rec in doc["ops"]:
        if "name" in fields:
            rec["name"] = next(it)
        if "loc" in fields:
            rec["loc"] = [next(it), rec.get("loc", ["", 1])[1]]
        if "derived_from" in fields:
            rec["derived_from"] = next(it)
        if "tags" in fields:
            rec["tags"] = [next(it), next(it)]
        if "params" in fields and rec["op"].startswith("user:"):
            # a user op's parameters are its attrs (all but dtype)
            params = rec.get("attrs", {})
            for k in params:
                if k != "dtype":
                    params[k] = next(it)
    if "metadata" in fields:
        doc["metadata"] = {next(it): next(it)}
        doc["producer"] = next(it)
    return json.dumps(doc)


def loads(text):
    """Loading a hostile document works or raises SerializationError: which one."""
    try:
        Loaded(text)
        return True
    except be.SerializationError:
        return False


def run(t, g, results, calls=2):
    """``(computation, results of the last of calls, values of g.variables)``."""
    comp = t.computation(results, g.x, g.y)
    for _ in range(calls):
        outs = comp(X, Y)
    return comp, [o for o in outs if o is not None], [np.array(t.state_view()[v])
                                                      for v in g.variables]


def same(got, want, tol=1e-6):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                                   rtol=tol, atol=tol)


@pytest.fixture(scope="module")
def clean():
    return be.serialize(Model(extra=1).results)


# --- documents --------------------------------------------------------------------------

def test_hostile_documents_compile_and_run_on_numpy(clean, marker):
    """Each hostile string alone in each string field that generated code shows, then
    all of them in all fields: loading works or raises SerializationError; the
    computation runs, nothing else does, and the values are those of the clean
    document."""
    g = Loaded(clean)
    _, want, want_state = run(be.NumPyTransformer(), g, g.results)
    strings = hostile_strings(marker)
    shown = ("name", "loc", "derived_from", "params")
    cases = [((f,), [s]) for f in shown for s in strings] + [(FIELDS, strings)]
    for fields, these in cases:
        try:
            g = Loaded(poison(clean, these, fields))
        except be.SerializationError:
            continue
        del LABELS[:]
        comp, got, state = run(be.NumPyTransformer(), g, g.results)
        same(got, want, 0)
        same(state, want_state, 0)
        labels = these if "params" in fields else ["plain"]
        assert LABELS and all(lab in labels for lab in LABELS)  # the parameter, intact
        assert comp.source.isascii()


@pytest.fixture(scope="module")
def hostile_gpu(tmp_path_factory):
    """``(folder, [(what, hostile graph, clean graph)])``: a document with every
    hostile string the loader accepts in every field, and a graph built in Python with
    them as names; each with more Variables than strings, so that every string names a
    Variable whose update is a kernel."""
    folder = tmp_path_factory.mktemp("hostile_gpu")
    strings = hostile_strings(str(folder / "ran"))
    text = be.serialize(Model(extra=len(strings)).results)
    accepted = [s for s in strings if loads(poison(text, [s]))]
    graphs = [("python", Model(itertools.cycle(strings), extra=len(strings)),
               Model(extra=len(strings)))]
    if accepted:
        graphs.append(("document", Loaded(poison(text, accepted)), Loaded(text)))
    return folder, graphs


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_hostile_names_cuda_compiles_with_nvcc(hostile_gpu):
    folder, graphs = hostile_gpu
    files = []
    for what, g, _ in graphs:
        comp = CudaCodegenTransformer().computation(g.gpu, g.x, g.y)
        assert comp.source.isascii()
        files.append(f"{what}.cu")
        (folder / files[-1]).write_text(comp.source)  # annotated: every name in comments
    run = subprocess.run([NVCC, "-ptx", "-arch=sm_90"] + files, cwd=folder,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not (folder / "ran").exists()


@pytest.mark.skipif(CXX is None, reason="no C++ compiler for the GPU emulator")
def test_hostile_names_run_on_the_emulator(hostile_gpu):
    folder, graphs = hostile_gpu
    for what, g, plain in graphs:
        _, want, want_state = run(be.NumPyTransformer(), plain, plain.gpu)
        _, got, state = run(GPUTransformer(runtime=EmulatorRuntime(seed=2)), g, g.gpu)
        same(got, want, 1e-5)
        same(state, want_state, 1e-5)
        assert not (folder / "ran").exists() and not hasattr(builtins, FLAG), what


# --- graphs built in Python, and be.run -------------------------------------------------

def test_hostile_names_in_python_graphs_and_be_run(marker):
    """The same strings as names of placeholders, Variables, ops and axes of a graph
    built in Python, compiled by a transformer and by ``be.run``."""
    plain = Model()
    _, want, want_state = run(be.NumPyTransformer(), plain, plain.results)
    strings = hostile_strings(marker)
    for start in range(len(strings)):
        names = itertools.cycle(strings[start:] + strings[:start])
        g = Model(names)
        _, got, state = run(be.NumPyTransformer(), g, g.results)
        same(got, want, 0)
        same(state, want_state, 0)
    for start in range(0, len(strings), 5):
        g = Model(itertools.cycle(strings[start:] + strings[:start]))
        for _ in range(2):  # as run()
            got = be.run(g.results, feeds={g.x: X, g.y: Y})
        same([v for v in got if v is not None], want, 0)
    for s in strings:  # as axis names too (errors and printing show them)
        a = be.Axis(3, s)
        v = be.Variable(a, initial_value=2.0, name=s)
        p = be.placeholder(a, name=s)
        got = be.run(be.tanh(v * p), feeds={p: np.ones(3, np.float32)})
        np.testing.assert_array_equal(got, np.tanh(np.full(3, 2.0, np.float32)))


def test_names_never_shadow_generated_names():
    """Names that were Python builtins the generated code calls, its own variables,
    or that are equal to another name only after Unicode normalization (the generated
    code read the other variable)."""
    B, D = be.Axis(512, "B"), be.Axis(512, "D")  # large enough to be fused in blocks
    for name in ["min", "range", "slice", "float", "_i", "_hi", "_s0", "_feed", "_last",
                 "__builtins__", "np", "run", "setup", "fi"]:
        v = be.Variable((B, D), initial_value=0.5, name=name)
        x = be.placeholder(D, name=name)
        comp = be.NumPyTransformer(compiled=False).computation(
            be.tanh(be.exp(v) * 2.0 + x), x)
        assert "_run_blocks" in comp.source
        np.testing.assert_allclose(comp(np.ones(512, np.float32)),
                                   np.tanh(np.exp(np.float32(0.5)) * 2 + 1), rtol=1e-6)
    a = be.Variable(C, initial_value=1.0, name="\ufb01")  # NFKC: "fi"
    b = be.Variable(C, initial_value=2.0, name="fi")
    np.testing.assert_array_equal(be.NumPyTransformer().computation(a * 10.0 + b)(), 12.0)


def test_user_ops_whose_names_normalize_alike_stay_apart():
    one = be.elementwise_op("\ufb01x", numpy=lambda x: x + 1.0, derivative=lambda x: 1.0)
    two = be.elementwise_op("fix", numpy=lambda x: x + 2.0, derivative=lambda x: 1.0)
    x = be.placeholder(C)
    comp = be.NumPyTransformer().computation([one(x), two(x)], x)
    got = comp(np.zeros(3, np.float32))
    np.testing.assert_array_equal(got[0], 1.0)
    np.testing.assert_array_equal(got[1], 2.0)


def test_user_op_parameter_names_are_ascii_identifiers():
    for bad in ["if", "\ufb01", "a b"]:
        with pytest.raises(ValueError, match="not ASCII identifiers"):
            be.define_op("BadParam", numpy=lambda x, **kw: x, axes=lambda x, **kw: x.axes,
                         params=(bad,))


def test_a_code_rule_that_bypasses_the_helpers_fails_instead_of_running(marker, monkeypatch):
    """The last check: a code rule (here a plugin's) that pastes a name into generated
    code unescaped makes the computation fail with GeonError; nothing runs."""
    from geon.op_graph import op_graph as og
    from geon.transformers.numpy.transformer import NUMPY_CODE
    monkeypatch.setitem(NUMPY_CODE, og.Tanh,
                        lambda op, out, args: [f"np.tanh({args[0]}, out={out})  # {op.name}"])
    for s in hostile_strings(marker)[:12]:
        x = be.placeholder(C)
        y = be.tanh(x)
        y.name = s
        with pytest.raises(be.GeonError, match="codegen_text"):
            be.NumPyTransformer().computation(y, x)


# --- the emulator's folder of compiled kernels ------------------------------------------

@pytest.fixture
def emulator(tmp_path, monkeypatch):
    """The emulator module, with the temp directory in ``tmp_path``."""
    module = sys.modules[EmulatorRuntime.__module__]
    monkeypatch.setattr(module.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(module, "_private", None, raising=False)
    return module


def test_emulator_folder_is_private(emulator, tmp_path):
    shared = tmp_path / f"geon-emulator-{os.getuid()}"
    assert emulator._cache_dir() == str(shared)
    assert os.stat(shared).st_mode & 0o777 == 0o700


def test_emulator_ignores_a_folder_it_does_not_control(emulator, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    os.symlink(target, tmp_path / f"geon-emulator-{os.getuid()}")
    private = emulator._cache_dir()
    assert private != str(tmp_path / f"geon-emulator-{os.getuid()}")
    st = os.lstat(private)
    assert st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o700


@pytest.mark.skipif(CXX is None, reason="no C++ compiler for the GPU emulator")
def test_emulator_never_loads_a_library_others_could_plant(emulator, tmp_path):
    """Another user made the per-user folder writable for all and put a library where
    the emulator would look for the compiled kernels: it is not loaded."""
    shared = tmp_path / f"geon-emulator-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    source = 'extern "C" int geon_answer() { return 42; }\n'
    planted = shared / f"kernels-{hashlib.sha256(source.encode()).hexdigest()[:24]}.so"
    planted.write_bytes(b"planted")
    path = emulator._build(source, "kernels")
    assert os.path.dirname(path) != str(shared)
    assert ctypes.CDLL(path).geon_answer() == 42
