"""Attribute lane: queries → engine scores → ranking → clusters → sentence drill-down.

The public names are imported on first use (PEP 562), so the torch-free spec (:mod:`gradian.attribute.spec`)
and the run's data check are read without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradian.util import lazy_attributes

_LAZY = {
    "AttributeSpec": "gradian.attribute.spec",
    "CapabilityAttribution": "gradian.attribute.pipeline",
    "ClusterSpec": "gradian.attribute.clusters",
    "Query": "gradian.attribute.queries",
    "attribute_capability": "gradian.attribute.pipeline",
    "make_query": "gradian.attribute.queries",
    "minimal_pair": "gradian.attribute.queries",
    "query_gradients": "gradian.attribute.queries",
}

__all__ = [
    "AttributeSpec",
    "CapabilityAttribution",
    "ClusterSpec",
    "Query",
    "attribute_capability",
    "make_query",
    "minimal_pair",
    "query_gradients",
]

if TYPE_CHECKING:  # pragma: no cover
    from gradian.attribute.clusters import ClusterSpec
    from gradian.attribute.pipeline import CapabilityAttribution, attribute_capability
    from gradian.attribute.queries import Query, make_query, minimal_pair, query_gradients
    from gradian.attribute.spec import AttributeSpec

__getattr__, __dir__ = lazy_attributes("gradian.attribute", _LAZY, globals())
