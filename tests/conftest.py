import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True, scope="session")
def kernel_cache(tmp_path_factory):
    """Compiled kernels (geon/transformers/numpy/compiled.py) go to a fresh cache."""
    import os
    old = os.environ.get("GEON_CACHE_DIR")
    os.environ["GEON_CACHE_DIR"] = str(tmp_path_factory.mktemp("geon-cache"))
    yield
    if old is None:
        os.environ.pop("GEON_CACHE_DIR", None)
    else:
        os.environ["GEON_CACHE_DIR"] = old


@pytest.fixture(autouse=True)
def verify_memory_plans():
    """Every memory plan made in a test is proved (geon/transformers/memory.py: on by
    default, as for users); a test that switches it off gets it back on after."""
    from geon.transformers import memory
    memory.VERIFY = True
    yield
    memory.VERIFY = True


@pytest.fixture(autouse=True)
def declared_primitives_restored():
    """A primitive a test declares (a new op's class with ``@primitive``) joins the
    standard base set only for that test (geon's own modules imported meanwhile keep
    theirs)."""
    from geon.op_graph import tables
    saved = list(tables._PRIMITIVES)
    yield
    tables.restore_primitives(saved)


@pytest.fixture(autouse=True)
def steady_thread_policy(monkeypatch):
    """The thread policy (geon/transformers/threads.py) answers its budget throughout a
    test and measures no load: on a loaded machine it would give one thread, and tests
    of work split over threads would silently test one. tests/test_threads.py tests
    the measurement on policies of its own."""
    from geon.transformers import threads
    monkeypatch.setattr(threads.POLICY, "threads", threads.POLICY.budget)
    monkeypatch.setattr(threads.POLICY, "_next", float("inf"))
