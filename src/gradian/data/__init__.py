"""Data layer: formats → :class:`Example`; tokenisation with loss masks and span maps."""

from gradian.data.formats import Example, load_examples, read_records, to_example
from gradian.data.tokenize import TokenizedExample, TokenizeSpec, collate, tokenize_example, tokenize_examples

__all__ = [
    "Example",
    "load_examples",
    "read_records",
    "to_example",
    "TokenizeSpec",
    "TokenizedExample",
    "tokenize_example",
    "tokenize_examples",
    "collate",
]
