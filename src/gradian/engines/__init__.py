"""Influence engines behind one interface: DataInf (default) and gradient-dot."""

from gradian.engines.base import Engine, EngineSpec, make_engine, score_index
from gradian.engines.datainf import DataInf
from gradian.engines.graddot import GradDot

__all__ = ["Engine", "EngineSpec", "make_engine", "score_index", "DataInf", "GradDot"]
