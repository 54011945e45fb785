"""A neon-style model-building frontend on geon: layers over named axes, seeded
initializers, optimizers as graph updates, a :class:`Model` with ``fit`` /
``evaluate`` / ``predict``, callbacks and data iterators. See doc/models.rst.

Use it as ``import geon.frontends.neon as nn``.
"""

from geon.frontends.neon.callbacks import (Callback, EarlyStopping,  # noqa: F401
                                           MetricsLog, ModelCheckpoint)
from geon.frontends.neon.data import ArrayIterator, load_digits  # noqa: F401
from geon.frontends.neon.initializers import (Constant, Gaussian,  # noqa: F401
                                              GlorotUniform, Initializer, KaimingNormal,
                                              Uniform)
from geon.frontends.neon.layers import (GRU, LSTM, Activation, Affine,  # noqa: F401
                                        BatchNorm, Conv, Embedding, Flatten, Layer,
                                        Dropout, LayerNorm, Pool, Recurrent, Sequential)
from geon.frontends.neon.model import Model  # noqa: F401
from geon.frontends.neon.optimizers import (SGD, Adam, AdamW,  # noqa: F401
                                            ExponentialDecay, Optimizer,
                                            PiecewiseConstant, RMSProp, Schedule)
from geon.frontends.neon.progress import Progress, make_progress  # noqa: F401
