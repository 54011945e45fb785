"""The thread policy (geon/transformers/threads.py): the budget from the environment
and the affinity mask, fewer threads while other processes keep cores busy, the
BLAS's count set through its own API without raising a user's limit, and geon's fused
groups and generated code following it."""

import threading

import numpy as np
import pytest

import geon as be
from geon.errors import GeonWarning
from geon.op_graph.symbols import Symbol
from geon.transformers import fusion, threads


def test_budget_reads_geon_then_omp_then_the_affinity_mask():
    cpus = len(threads.affinity_cpus())
    assert threads.budget({}) == cpus
    assert threads.budget({"OMP_NUM_THREADS": "3"}) == 3
    assert threads.budget({"OMP_NUM_THREADS": "3", "GEON_NUM_THREADS": "5"}) == 5
    assert threads.budget({"GEON_NUM_THREADS": "0", "OMP_NUM_THREADS": "2"}) == 2
    with pytest.warns(GeonWarning, match="GEON_NUM_THREADS='many' is not an integer"):
        assert threads.budget({"GEON_NUM_THREADS": "many"}) == cpus


class _Clock:
    """A /proc/stat file and a process CPU clock that a test moves forward."""

    def __init__(self, tmp_path, cpus):
        self.path = tmp_path / "stat"
        self.cpus = cpus
        self.busy = 0          # ticks of every CPU together
        self.own = 0.0         # this process's CPU seconds
        self.write()

    def write(self):
        lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
        per = self.busy // len(self.cpus)
        for k, c in enumerate(self.cpus):
            extra = self.busy - per * len(self.cpus) if k == 0 else 0
            # user nice system idle iowait irq softirq steal guest guest_nice
            lines.append(f"cpu{c} {per + extra} 0 0 999999 7 0 0 0 0 0")
        lines.append("intr 1 2 3")
        self.path.write_text("\n".join(lines) + "\n")

    def advance(self, others_cores, own_cores, seconds, tick):
        self.busy += int(round((others_cores + own_cores) * seconds * tick))
        self.own += own_cores * seconds
        self.write()


@pytest.fixture
def two_cpus(monkeypatch, tmp_path):
    """A policy over two CPUs reading a fake /proc/stat, with its own clocks."""
    monkeypatch.setattr(threads, "affinity_cpus", lambda: [0, 1])
    clock = _Clock(tmp_path, [0, 1])
    now = [1000.0]
    monkeypatch.setattr(threads.time, "process_time", lambda: clock.own)
    monkeypatch.setattr(threads.time, "monotonic", lambda: now[0])
    policy = threads.Policy(environ={}, stat_path=str(clock.path))
    policy._blas_looked = True  # leave the process's BLAS alone here
    tick = policy._tick

    def step(others, own, seconds=threads.INTERVAL):
        now[0] += seconds
        clock.advance(others, own, seconds, tick)
        return policy.refresh()
    return policy, step


def test_other_processes_busy_cores_are_given_up(two_cpus):
    policy, step = two_cpus
    assert policy.budget == 2 and policy.adaptive
    assert step(0.0, 2.0) == 2        # the first reading: nothing to compare yet
    assert step(0.0, 2.0) == 2        # only our own threads busy: both cores
    assert step(1.0, 1.0) == 1        # another process keeps a core busy
    assert step(0.95, 1.0) == 1
    assert step(0.3, 1.5) == 2        # short wake-ups of others are not load
    assert step(2.0, 0.0) == 1        # never fewer than one
    assert policy.changes == 3


def test_the_load_is_measured_once_per_interval(two_cpus):
    policy, step = two_cpus
    step(0.0, 2.0)
    step(1.0, 1.0)
    assert policy.threads == 1
    # within the interval the last answer stands, whatever the load did meanwhile
    assert step(0.0, 2.0, seconds=threads.INTERVAL / 4) == 1


def test_adaptation_can_be_turned_off(monkeypatch, tmp_path):
    monkeypatch.setattr(threads, "affinity_cpus", lambda: [0, 1])
    policy = threads.Policy(environ={"GEON_ADAPT_THREADS": "0"},
                            stat_path=str(tmp_path / "missing"))
    policy._blas_looked = True
    assert not policy.adaptive and policy.refresh() == 2


def test_a_missing_proc_stat_keeps_the_budget(monkeypatch, tmp_path):
    monkeypatch.setattr(threads, "affinity_cpus", lambda: [0, 1])
    policy = threads.Policy(environ={}, stat_path=str(tmp_path / "missing"))
    policy._blas_looked = True
    assert policy.adaptive and policy.refresh() == 2


@pytest.fixture
def blas_api():
    """``(get, put)`` of the BLAS's thread count, restored after the test."""
    api = threads._blas_thread_api()
    if api is None:
        pytest.skip("NumPy's BLAS is not an OpenBLAS with a thread API here")
    before = api[0]()
    yield api
    api[1](before)


def test_the_blas_gets_the_count_but_never_above_its_limit(blas_api):
    get, put = blas_api
    put(1)                                      # a user's limit (threadpoolctl, env)
    policy = threads.Policy(environ={"GEON_NUM_THREADS": "4", "GEON_ADAPT_THREADS": "0"})
    assert policy.refresh() == 4
    assert get() == 1                           # not raised over the user's limit
    put(2)                                      # the user raises it
    policy._next = 0.0
    policy.refresh()
    assert get() == 2
    policy.threads = 4
    policy._apply_blas(1)                       # the policy lowers it under load
    assert get() == 1
    policy._apply_blas(4)                       # and gives it back, up to the limit
    assert get() == 2


def test_fused_groups_use_only_the_active_threads(monkeypatch):
    seen = set()

    def fn(lo, hi, scratch):
        seen.add(threading.get_ident())

    monkeypatch.setattr(threads.POLICY, "threads", 1)
    fusion.run_blocks(fn, 64, 1, [(None,), (None,)])
    assert seen == {threading.get_ident()}


def test_generated_code_asks_the_policy_only_where_work_is_parallel():
    F, H = be.Axis(64, "F"), be.Axis(32, "H")
    N = be.Axis(16, "N", batch=True)
    x = be.placeholder((F, N), name="x")
    w = be.Variable((H, F), initial_value=0.1)
    t = be.make_transformer("numpy")
    product = t.computation(be.tanh(be.dot(w, x)), x)
    plus_one = t.computation(x + 1.0, x)
    assert "_threads(" in product.source
    assert "_threads(" not in plus_one.source
    X = np.ones((64, 16), np.float32)
    np.testing.assert_allclose(product(X), np.tanh(np.full((32, 16), 6.4)), rtol=1e-6)


def test_small_products_run_on_one_blas_thread(monkeypatch):
    """A computation whose products are all below SERIAL_PRODUCT multiply-adds asks
    for one BLAS thread; one with a larger product, or a symbolic length, does not."""
    from geon.transformers.numpy import blas
    K, M = be.Axis(64, "K"), be.Axis(48, "M")
    N = be.Axis(16, "N", batch=True)
    x = be.placeholder((K, N), name="x")
    w = be.Variable((M, K), initial_value=0.1)
    small = be.NumPyTransformer().computation(be.dot(w, x), x)
    assert "_threads(1)" in small.source
    monkeypatch.setattr(blas, "SERIAL_PRODUCT", 64 * 48 * 16)  # now just too large
    large = be.NumPyTransformer().computation(be.dot(w, x), x)
    assert "_threads()" in large.source
    S = be.np.placeholder((Symbol("n"), 64), dtype=np.float32)
    W = be.np.constant(np.ones((64, 8), np.float32))
    monkeypatch.setattr(blas, "SERIAL_PRODUCT", 1 << 40)
    symbolic = be.NumPyTransformer().computation(be.np.matmul(S, W), S)
    assert "_threads()" in symbolic.source
    got = symbolic(np.ones((3, 64), np.float32))
    np.testing.assert_array_equal(got, np.full((3, 8), 64, np.float32))


def test_the_product_sizes_of_convolutions_and_batched_products(monkeypatch):
    """A batched product counts one matrix; a convolution's three primitives count
    (batch x output channels x positions) x (input channels per group x taps)."""
    from geon.op_graph import primitives as pr
    from geon.transformers.numpy import blas
    a = be.np.placeholder((5, 3, 4), dtype=np.float32)
    b = be.np.placeholder((5, 4, 7), dtype=np.float32)
    assert blas._product_size(pr.Gemm(a, b)) == 3 * 4 * 7
    assert blas._product_size(a + 1) == 0
    x = be.np.placeholder((2, 6, 9, 9), dtype=np.float32)
    w = be.np.placeholder((8, 3, 3, 3), dtype=np.float32)
    y = be.np.conv(x, w, padding=((1, 1), (1, 1)), groups=2)
    loss = be.np.sum(y * y)
    t = be.NumPyTransformer()
    size = 2 * 8 * 9 * 9 * (3 * 3 * 3)
    for limit, cap in ((size, 0), (size + 1, 1)):
        monkeypatch.setattr(blas, "SERIAL_PRODUCT", limit)
        comp = t.computation([y] + be.deriv(loss, [x, w]), x, w)
        assert comp.largest_product == size
        assert f"_threads({cap or ''})" in comp.source


def test_a_subgraphs_products_count_for_its_caller(monkeypatch):
    """A scan's body runs under its caller's thread count: the caller asks for one BLAS
    thread only where the body's products are small too."""
    from geon.transformers.numpy import blas
    H = 32
    w = be.np.constant(np.full((H, H), 0.01, np.float32))
    xs = be.np.placeholder((5, 4, H), dtype=np.float32)
    h0 = be.np.placeholder((4, H), dtype=np.float32)

    def body(h, x):
        h = be.np.tanh(be.np.matmul(h, w) + x)
        return h, h
    for limit, cap in ((4 * H * H, 0), (4 * H * H + 1, 1)):
        monkeypatch.setattr(blas, "SERIAL_PRODUCT", limit)
        last, _ = be.scan(body, h0, xs, xs.axes[0])
        comp = be.NumPyTransformer().computation(last, h0, xs)
        assert comp.largest_product == 4 * H * H
        assert f"_threads({cap or ''})" in comp.source
        got = comp(np.zeros((4, H), np.float32), np.ones((5, 4, H), np.float32))
        want = np.zeros((4, H), np.float32)
        for _ in range(5):
            want = np.tanh(want @ np.full((H, H), 0.01, np.float32) + 1)
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_the_blas_cap_applies_to_the_call_that_asks_for_it(blas_api):
    get, put = blas_api
    put(2)
    policy = threads.Policy(environ={"GEON_NUM_THREADS": "2", "GEON_ADAPT_THREADS": "0"})
    assert policy.refresh() == 2 and get() == 2
    assert policy.refresh(1) == 2 and get() == 1   # geon's groups keep their count
    assert policy.refresh(1) == 2 and get() == 1
    assert policy.refresh() == 2 and get() == 2    # the next big call gets them back
    policy._next = 0.0                            # a new interval, with a cap
    assert policy.refresh(1) == 2 and get() == 1
