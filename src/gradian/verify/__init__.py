"""Verify lane: test a verdict by retraining without the blamed rows (``gradian verify``)."""

from gradian.verify.run import Retrain, VerifySpec, blamed_rows, plan, verify_run

__all__ = ["Retrain", "VerifySpec", "blamed_rows", "plan", "verify_run"]
