"""Verify lane: test a verdict by retraining without the blamed rows (``gradian verify``)."""

from gradian.verify.run import (
    Prepared,
    Retrain,
    VerifyInputs,
    VerifySpec,
    blamed_rows,
    plan,
    prepare_verify,
    verify_run,
)

__all__ = ["Prepared", "Retrain", "VerifyInputs", "VerifySpec", "blamed_rows", "plan", "prepare_verify", "verify_run"]
