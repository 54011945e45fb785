"""The registry of transformers: names -> factories.

It lives outside both layers so that each can reach it: backends register themselves
here (``geon/transformers/``), and the op graph (``geon/op_graph/``, which never imports
a backend) asks it for a transformer by name, e.g. :func:`geon.run` for its default
``"numpy"`` transformer. Installed plugins are found through the ``geon.transformers``
entry-point group.
"""

from importlib import metadata

from typing import (IO, TYPE_CHECKING, Any, Callable, Iterable, Literal, Optional,
                    Protocol, Union, overload)

from geon.errors import UnknownTransformerError

if TYPE_CHECKING:  # for the types only: the transformers import this module
    from geon.transformers.base import Transformer
    from geon.transformers.gpu.transformer import GPUTransformer
    from geon.transformers.numpy.transformer import NumPyTransformer

#: What :func:`register_transformer` takes: the transformer class, or any callable
#: making one from ``make_transformer``'s keywords.
TransformerFactory = Callable[..., "Transformer"]

_REGISTRY: dict[str, TransformerFactory] = {}
#: The entry-point group installed transformers are listed under.
ENTRY_POINT_GROUP = "geon.transformers"


def register_transformer(name: str, factory: TransformerFactory) -> None:
    """Make ``make_transformer(name)`` call ``factory(**kwargs)``."""
    _REGISTRY[name] = factory


def _entry_points() -> dict[str, metadata.EntryPoint]:
    try:
        return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    except Exception:  # a broken installed distribution must not break geon
        return {}


def available_transformers() -> list[str]:
    """Names accepted by :func:`make_transformer`, registered or installed."""
    return sorted(set(_REGISTRY) | set(_entry_points()))


def transformer_factory(name: str) -> TransformerFactory:
    """The factory (usually the class) registered or installed under ``name``; an
    :class:`~geon.errors.UnknownTransformerError` listing the names if there is none."""
    factory = _REGISTRY.get(name)
    if factory is None:
        ep = _entry_points().get(name)
        if ep is None:
            raise UnknownTransformerError(
                f"no transformer named {name!r}; available: "
                f"{', '.join(available_transformers())}")
        factory = ep.load()
        _REGISTRY[name] = factory
    return factory


if TYPE_CHECKING:
    class _MakeTransformer(Protocol):
        """The type of :func:`make_transformer`: the transformer's class for the names
        geon registers itself (with that class's keywords), :class:`Transformer` for
        any other name. (Overloads in a protocol rather than on the function: Sphinx
        would show the overloads in place of the function's signature, and the GPU
        class has no page in the API reference to link to.)"""

        @overload
        def __call__(self, name: Literal["numpy"] = "numpy", *,
                     disable: Iterable[str] = (), dump_after: Iterable[str] = (),
                     dump_file: Optional[IO[str]] = None,
                     sample_axis: Optional[str] = None, check_numerics: bool = False,
                     compiled: Union[bool, str, None] = None) -> NumPyTransformer: ...

        @overload
        def __call__(self, name: Literal["gpu"], *, device: int = 0, runtime: Any = None,
                     gemm: str = "auto", cuda_graphs: bool = True,
                     check_numerics: bool = False, disable: Iterable[str] = (),
                     dump_after: Iterable[str] = (), dump_file: Optional[IO[str]] = None,
                     sample_axis: Optional[str] = None) -> GPUTransformer: ...

        @overload
        def __call__(self, name: str, **kwargs: Any) -> Transformer: ...

    make_transformer: _MakeTransformer
else:
    def make_transformer(name: str = "numpy", **kwargs: Any) -> "Transformer":
        """A new transformer registered under ``name`` (built in, through
        :func:`register_transformer`, or installed under the ``geon.transformers``
        entry-point group).

        To a type checker, ``make_transformer("numpy", ...)`` is a
        :class:`~geon.NumPyTransformer` and ``make_transformer("gpu", ...)`` a
        ``geon.transformers.gpu.GPUTransformer``, each taking its class's keywords;
        another name gives a :class:`~geon.Transformer`."""
        return transformer_factory(name)(**kwargs)
