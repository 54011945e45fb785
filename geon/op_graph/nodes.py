"""Graph nodes: names, source locations, and the arg / dependency bookkeeping of ops.

``Node`` derives from :class:`NameableValue` (a settable name) and :class:`DebugInfo`
(where in the user's code the node was built). Ops (``geon.op_graph.op_graph.Op``)
derive from ``Node``.
"""

import gc
import os
import sys
import weakref
from threading import get_ident

from geon.errors import ArgumentError


def _package_dir():
    """geon's package folder, after checking that ``import geon`` found it.

    A folder named ``geon`` beside the user's script (or in the working directory, or
    earlier on ``sys.path``) can shadow the installed package: without an
    ``__init__.py`` Python imports it as an empty namespace package (an editable install
    still serves geon's submodules), with one as another package. Either way the API is
    missing; say so here instead of failing obscurely later.
    """
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # the top package is imported (or being imported) before any of its submodules
    geon = sys.modules[__name__.partition(".")[0]]
    found = getattr(geon, "__file__", None)
    if found is not None:
        def real(path):
            return os.path.normcase(os.path.realpath(path))
        if real(os.path.dirname(found)) == real(here):
            return os.path.dirname(os.path.abspath(found)) + os.sep
        what = f"another package, {found}"
    else:
        where = list(getattr(geon, "__path__", None) or []) or ["an unknown place"]
        what = (f"the folder {', '.join(map(str, where))}, which has no __init__.py: "
                f"Python imported it as an empty namespace package")
    raise ImportError(
        f"`import geon` found {what}, not the geon package (installed at {here}), so "
        f"geon's API (geon.placeholder, ...) is missing. A folder named geon beside the "
        f"script you run, in the working directory or earlier on sys.path (a clone of "
        f"geon's repository named geon, for instance) hides the installed package: run "
        f"from another directory, or rename or move that folder.", name="geon")


_GEON_DIR = _package_dir()
_USER_DIRS = tuple(os.path.join(_GEON_DIR, d) + os.sep for d in ("examples",))

# Per-class counters for default names. They hold integers only, never ops.
_name_counters = {}


class NameableValue:
    """A value with a settable ``name``; the default is ``<ClassName>_<n>``."""

    def __init__(self, name=None):
        if name is None:
            cls = type(self).__name__
            n = _name_counters.get(cls, 0)
            _name_counters[cls] = n + 1
            name = f"{cls}_{n}"
        self.name = name

    @property
    def name(self):
        """The node's name (settable)."""
        return self._name

    @name.setter
    def name(self, value):
        if not isinstance(value, str) or not value:
            raise ArgumentError(f"a name must be a non-empty string, not {value!r}")
        self._name = value


# Per code object: is it geon's library code? (Code objects, never ops.)
_library_code = {}


def _user_frame():
    """The innermost stack frame that is not geon's library code."""
    f = sys._getframe(2)
    lib = _library_code
    while f is not None:
        code = f.f_code
        is_lib = lib.get(code)
        if is_lib is None:
            fn = code.co_filename
            is_lib = lib[code] = fn.startswith(_GEON_DIR) and not fn.startswith(_USER_DIRS)
        if not is_lib:
            return f
        f = f.f_back
    return None


#: ``(thread id, filename, lineno)`` of the user's line while an op builds the ops it
#: needs (the Constants of its Python-number args) and itself: one stack walk for all
#: of them. A node only takes an entry of its own thread (else it walks the stack).
_site_stack = []


def user_site():
    """``(thread id, filename, lineno)`` of the user's code calling into geon now."""
    f = _user_frame()
    return (get_ident(), "<unknown>", 0) if f is None else (
        get_ident(), f.f_code.co_filename, f.f_lineno)


def user_stacklevel():
    """The ``stacklevel`` for ``warnings.warn`` called right here that makes the
    warning point at the user's code (the innermost frame outside geon)."""
    f, level = sys._getframe(1), 1
    target = _user_frame()
    while f is not None and f is not target:
        f, level = f.f_back, level + 1
    return level


def user_location():
    """``File "path", line N`` of the user's code calling into geon right now (for
    errors raised outside any op, such as ``deriv``'s)."""
    f = _user_frame()
    return "<unknown>" if f is None else f'File "{f.f_code.co_filename}", line {f.f_lineno}'


class DebugInfo:
    """Where a node was built: ``filename``, ``lineno`` and a clickable ``file_info``.

    Nodes built by a rewrite or by ``deriv`` on behalf of another node inherit that
    node's location, so that lowered code points at the user's line.
    """

    #: ``"<Class> <name>"`` of the user's op this node was derived from by a rewrite.
    derived_from = None

    def __init__(self):
        src = _rewrite_source()
        if src is not None:
            self.filename, self.lineno = src.filename, src.lineno
            self.derived_from = src.derived_from or f"{type(src).__name__} {src.name}"
            return
        f = _user_frame()
        if f is None:
            self.filename, self.lineno = "<unknown>", 0
        else:
            self.filename, self.lineno = f.f_code.co_filename, f.f_lineno

    @property
    def file_info(self):
        """``File "path", line N``: the form editors and terminals turn into a link."""
        return f'File "{self.filename}", line {self.lineno}'


class WeakNodeSet(dict):
    """A set of nodes held by weak references (a lighter ``weakref.WeakSet``): the ops
    that use a node must not keep each other alive.

    It is a dict from ``id(node)`` to a weak reference (one object per set, not two:
    every op has one, and the garbage collector scans each). Use it only through
    ``add``, ``discard``, ``in``, iteration and ``len``, which see live nodes.
    """

    __slots__ = ()

    def add(self, node):
        self[id(node)] = weakref.ref(node)

    def discard(self, node):
        r = self.get(id(node))
        if r is not None and r() is node:
            del self[id(node)]

    def __contains__(self, node):
        r = self.get(id(node))
        return r is not None and r() is node

    def __iter__(self):
        live = []
        for k, r in list(self.items()):
            node = r()
            if node is None:
                del self[k]  # its node is gone (the id may be reused later)
            else:
                live.append(node)
        return iter(live)

    def __len__(self):
        return len(list(iter(self)))

    def __bool__(self):
        return any(True for _ in self)


class OrderedSet:
    """A small insertion-ordered set (a dict's keys), for deterministic dependency lists."""

    __slots__ = ("_d",)

    def __init__(self, items=()):
        self._d = dict.fromkeys(items) if items else {}

    def add(self, item):
        self._d[item] = None

    def discard(self, item):
        self._d.pop(item, None)

    def update(self, items):
        for i in items:
            self._d[i] = None

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)

    def __contains__(self, item):
        return item in self._d

    def __repr__(self):
        return "{" + ", ".join(getattr(i, "name", repr(i)) for i in self._d) + "}"


class _Empty:
    """Shared by the nodes that have no dependency or dependent of a kind (most
    nodes): fewer objects for the garbage collector to scan. It never grows; a node
    that gains one gets its own set first."""

    def add(self, item):
        raise TypeError("internal: the shared empty set of a node cannot grow")

    update = add


class _EmptyOrderedSet(_Empty, OrderedSet):
    __slots__ = ()


class _EmptyNodeSet(_Empty, WeakNodeSet):
    __slots__ = ()


_NO_DEPS = _EmptyOrderedSet()
_NO_USERS = _EmptyNodeSet()


# --- the rewrite context ---------------------------------------------------------------
# While a pass rewrites op X, the ops it builds take X's source location and X's
# other_deps (they compute X's value, so they may run where X ran) instead of the
# user_deps of their args: a SetItem built later must not reorder a lowered read.
_rewrite_stack = []


def _rewrite_source():
    return _rewrite_stack[-1][0] if _rewrite_stack else None


class no_gc:
    """Context manager pausing the cyclic garbage collector while a pass or ``deriv``
    builds many ops and frees few: its repeated full scans would make that superlinear."""

    def __enter__(self):
        self.enabled = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            gc.enable()
        return False


class rewriting:
    """Context manager used by passes (and ``deriv``): ops built inside stand in for
    ``source``, whose location and other_deps they take.

    ``created`` lists, in build order, the ops built inside the block. ``by_pass``
    says a pass is rewriting (frontend conveniences such as family coercions are then
    off); ``deriv`` builds its ops with ``by_pass=False``.
    """

    def __init__(self, source, by_pass=True):
        self.source = source
        self.created = []
        self.by_pass = by_pass

    def __enter__(self):
        _rewrite_stack.append((self.source, self.created, self.by_pass))
        return self

    def __exit__(self, *exc):
        _rewrite_stack.pop()
        return False


def _note_created(node):
    """Record ``node`` in the active rewrite; returns the source op (or None)."""
    if _rewrite_stack:
        src, created, _ = _rewrite_stack[-1]
        created.append(node)
        return src
    return None


def in_pass():
    """Whether a pass is rewriting the graph right now."""
    return bool(_rewrite_stack) and _rewrite_stack[-1][2]


#: Changes whenever a node that a kept graph walk holds (``Node._walked``, set by
#: geon.op_graph.run) is rewired: its args, other_deps or forward. The kept walks
#: compare it; building nodes, or rewiring others (a pass over a copy), does not change it.
graph_edits = 0


def note_rewired(node):
    """Called where ``node``'s args, other_deps or forward change: marks the kept
    walks stale if one holds ``node`` (see :data:`graph_edits`)."""
    global graph_edits
    if node._walked:
        graph_edits += 1


class Node(NameableValue, DebugInfo):
    """A graph node: ``args``, ``other_deps``, ``user_deps``, ``users`` and ``forward``.

    Args:
        args: the nodes whose values this node uses, in order.
        name: optional name.
        follows: nodes that must run before this one besides ``args``.
    """

    #: ``(args, other_deps)`` as built, kept when a pass first rewires this node (what
    #: the printers show by default); ``False`` for nodes a pass built.
    _as_built = None

    #: Whether a kept graph walk holds this node (see :func:`note_rewired`).
    _walked = False

    # Most nodes have none of these: they share one empty set until they gain one.
    user_deps: "OrderedSet" = _NO_DEPS
    _dep_users = _NO_USERS

    def __init__(self, args=(), name=None, follows=()):
        # NameableValue's and DebugInfo's __init__, inlined: every op runs this
        if name is None:
            cls = type(self).__name__
            n = _name_counters.get(cls, 0)
            _name_counters[cls] = n + 1
            self._name = f"{cls}_{n}"
        else:
            self.name = name
        top = _rewrite_stack[-1] if _rewrite_stack else None
        if top is None:
            site = _site_stack[-1] if _site_stack else None
            if site is not None and site[0] == get_ident():
                _, self.filename, self.lineno = site
            else:
                f = _user_frame()
                if f is None:
                    self.filename, self.lineno = "<unknown>", 0
                else:
                    self.filename, self.lineno = f.f_code.co_filename, f.f_lineno
        else:
            src = top[0]
            self.filename, self.lineno = src.filename, src.lineno
            self.derived_from = src.derived_from or f"{type(src).__name__} {src.name}"
        self._args = args = tuple(args)
        self.users = WeakNodeSet()
        self.forward = None
        if top is None:
            inherited = [d for a in args for d in a.user_deps._d]
        else:
            top[1].append(self)  # the rewrite's ``created``
            inherited = top[0].other_deps
            if top[2]:  # built by a pass
                self._as_built = False
        if follows or inherited:
            self.other_deps = OrderedSet(follows)
            self.other_deps.update(inherited)
        else:
            self.other_deps = _NO_DEPS
        for a in args:
            a.users.add(self)
        for d in self.other_deps:
            d._add_dep_user(self)

    def _add_dep_user(self, node):
        if self._dep_users is _NO_USERS:
            self._dep_users = WeakNodeSet()
        self._dep_users.add(node)

    @property
    def args(self):
        """The nodes whose values this node uses."""
        return self._args

    def as_built(self):
        """``(args, other_deps)`` as this node was built, before passes rewired it."""
        b = self._as_built
        return b if b else (self._args, tuple(self.other_deps))

    def _keep_as_built(self):
        if self._as_built is None:
            self._as_built = (self._args, tuple(self.other_deps))

    def add_other_dep(self, dep):
        """Make ``dep`` run before this node (passes call it: a node built by the user
        keeps its dependencies as built, see :meth:`as_built`)."""
        if dep is not self and dep not in self.other_deps:
            if self._walked:
                note_rewired(self)
            self._keep_as_built()
            if self.other_deps is _NO_DEPS:
                self.other_deps = OrderedSet()
            self.other_deps.add(dep)
            dep._add_dep_user(self)

    def replace_arg(self, old, new):
        """Point every use of ``old`` in ``args`` and ``other_deps`` at ``new`` (passes
        call it: a node built by the user keeps its dependencies as built, see
        :meth:`as_built`)."""
        if old in self._args or old in self.other_deps:
            if self._walked:
                note_rewired(self)
            self._keep_as_built()
        if old in self._args:
            self._args = tuple(new if a is old else a for a in self._args)
            new.users.add(self)
            old.users.discard(self)
        if old in self.other_deps:
            self.other_deps.discard(old)
            old._dep_users.discard(self)
            self.add_other_dep(new)

    def all_deps(self):
        """``args`` followed by ``other_deps``."""
        deps = self.other_deps._d
        return self._args + tuple(deps) if deps else self._args
