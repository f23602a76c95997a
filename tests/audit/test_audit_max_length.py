"""Audit's assumed max length is ``gradian.defaults.MAX_LENGTH`` (one default per concept), its provenance unchanged."""

from __future__ import annotations

from gradian import defaults
from gradian.audit import context
from gradian.audit.config import TrainConfig
from gradian.audit.context import AuditContext


def _ctx(cfg):
    return AuditContext(None, None, cfg, None, None, None, {}, {})


def test_no_config_assumes_the_shared_default_with_its_provenance():
    assert not hasattr(context, "ASSUMED_MAX_LENGTH")  # no second copy of the value
    assert defaults.MAX_LENGTH == 1024
    assert _ctx(None).max_length() == (1024, "assumed: no config given, TRL SFTConfig's default max_length=1024")


def test_a_config_naming_no_trainer_assumes_it_too(monkeypatch):
    got = _ctx(TrainConfig()).max_length()
    assert got == (1024, "assumed: the config names no trainer, TRL's default max_length=1024")
    monkeypatch.setattr(context, "MAX_LENGTH", 2048)  # read at call time from the one imported default
    assert _ctx(None).max_length()[0] == 2048
