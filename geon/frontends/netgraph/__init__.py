"""Neural-architecture graphs and their translators.

:class:`Graph` is the architecture model (nodes, weighted edges, recurrent edges,
multigraphs). :func:`to_pytorch_model` builds a PyTorch ``nn.Module`` of a graph (torch is
imported only then); :func:`to_geon` builds the same computation from geon ops. See the
"Architecture graphs" chapter of the user guide.
"""

from geon.frontends.netgraph.graph import (ACTIVATIONS, AGGREGATIONS, Edge, Graph,
                                           GraphError, Node, NodeType)
from geon.frontends.netgraph.geon_impl import GeonNet, Stepper, to_geon
from geon.frontends.netgraph.pytorch import (TorchMissingError, clear_translation_cache,
                                             get_translation_cache_metrics,
                                             set_translation_cache_enabled,
                                             to_pytorch_model)

__all__ = ["ACTIVATIONS", "AGGREGATIONS", "Edge", "GeonNet", "Graph", "GraphError", "Node",
           "NodeType", "Stepper", "TorchMissingError", "clear_translation_cache",
           "get_translation_cache_metrics", "set_translation_cache_enabled", "to_geon",
           "to_pytorch_model"]
