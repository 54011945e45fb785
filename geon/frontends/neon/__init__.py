"""A neon-style model-building frontend on geon: layers over named axes, seeded
initializers, optimizers as graph updates, a :class:`Model` with Keras's ``fit`` /
``evaluate`` / ``predict`` and ``summary``, a :class:`History` of the training with
its plot, callbacks and data iterators. See doc/models.rst.

Use it as ``import geon.frontends.neon as nn``.
"""

from geon.frontends.neon.callbacks import (Callback, EarlyStopping, History,
                                           MetricsLog, ModelCheckpoint)
from geon.frontends.neon.data import ArrayIterator, load_digits
from geon.frontends.neon.initializers import (Constant, Gaussian,
                                              GlorotUniform, Initializer, KaimingNormal,
                                              Uniform)
from geon.frontends.neon.layers import (GRU, LSTM, Activation, Affine,
                                        BatchNorm, Conv, Embedding, Flatten, Layer,
                                        Dropout, LayerNorm, Pool, Recurrent, Sequential)
from geon.frontends.neon.model import Model
from geon.frontends.neon.optimizers import (SGD, Adam, AdamW,
                                            ExponentialDecay, Optimizer,
                                            PiecewiseConstant, RMSProp, Schedule)
from geon.frontends.neon.progress import Progress, make_progress

__all__ = ["Activation", "Adam", "AdamW", "Affine", "ArrayIterator", "BatchNorm",
           "Callback", "Constant", "Conv", "Dropout", "EarlyStopping", "Embedding",
           "ExponentialDecay", "Flatten", "GRU", "Gaussian", "GlorotUniform", "History",
           "Initializer", "KaimingNormal", "LSTM", "Layer", "LayerNorm", "MetricsLog",
           "Model", "ModelCheckpoint", "Optimizer", "PiecewiseConstant", "Pool",
           "Progress", "RMSProp", "Recurrent", "SGD", "Schedule", "Sequential",
           "Uniform", "load_digits", "make_progress"]
