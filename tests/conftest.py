import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True, scope="session")
def verify_memory_plans():
    """Prove every memory plan made during the tests (see geon/transformers/memory.py)."""
    from geon.transformers import memory
    memory.VERIFY = True
    yield
