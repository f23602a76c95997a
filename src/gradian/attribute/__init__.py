"""Attribute lane: queries → engine scores → ranking → clusters → sentence drill-down."""

from gradian.attribute.clusters import ClusterSpec
from gradian.attribute.pipeline import AttributeSpec, CapabilityAttribution, attribute_capability
from gradian.attribute.queries import Query, make_query, minimal_pair, query_gradients

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
