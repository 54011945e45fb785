"""The registry of transformers: names -> factories.

It lives outside both layers so that each can reach it: backends register themselves
here (``geon/transformers/``), and the op graph (``geon/op_graph/``, which never imports
a backend) asks it for a transformer by name, e.g. :func:`geon.run` for its default
``"numpy"`` transformer. Installed plugins are found through the ``geon.transformers``
entry-point group.
"""

from importlib import metadata

from typing import Any, Callable

from geon.errors import UnknownTransformerError

_REGISTRY: dict[str, Callable[..., Any]] = {}
#: The entry-point group installed transformers are listed under.
ENTRY_POINT_GROUP = "geon.transformers"


def register_transformer(name: str, factory: Callable[..., Any]) -> None:
    """Make ``make_transformer(name)`` call ``factory(**kwargs)``."""
    _REGISTRY[name] = factory


def _entry_points():
    try:
        return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    except Exception:  # a broken installed distribution must not break geon
        return {}


def available_transformers() -> list[str]:
    """Names accepted by :func:`make_transformer`, registered or installed."""
    return sorted(set(_REGISTRY) | set(_entry_points()))


def transformer_factory(name):
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


def make_transformer(name: str = "numpy", **kwargs: Any) -> Any:
    """A new transformer registered under ``name`` (built in, through
    :func:`register_transformer`, or installed under the ``geon.transformers``
    entry-point group)."""
    return transformer_factory(name)(**kwargs)
