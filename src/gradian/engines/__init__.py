"""Gradient influence engines behind one interface and one registry (:mod:`gradian.engines.registry`).

DataInf (the default), EK-FAC and gradient-dot; each has its own typed spec.
"""

from gradian.engines.base import Engine, EngineSpec, ModelPass, score_index
from gradian.engines.datainf import DataInf, DataInfSpec
from gradian.engines.graddot import GradDot, GradDotSpec
from gradian.engines.registry import engine_names, engine_spec, fit_engine, make_engine, register

__all__ = [
    "Engine",
    "EngineSpec",
    "ModelPass",
    "score_index",
    "DataInf",
    "DataInfSpec",
    "GradDot",
    "GradDotSpec",
    "engine_names",
    "engine_spec",
    "fit_engine",
    "make_engine",
    "register",
]
