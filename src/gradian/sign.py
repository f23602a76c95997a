"""The sign convention, fixed here once and imported everywhere else.

An influence *score* for training example j on a query q is

    score_j = ⟨ g_q , P g_j ⟩

where ``g_q`` is the gradient of the query *objective to be lowered* (a loss:
cross-entropy on the correct answer, or the contrastive
``ℓ(correct) − ℓ(what the model said)``), ``g_j`` is the gradient of example
j's training loss, and ``P`` is a positive semi-definite preconditioner (the
identity for gradient-dot, a damped inverse curvature for DataInf).

A gradient step on example j moves the adapter by ``−η g_j``; to first order
this changes the query loss by ``−η ⟨g_q, g_j⟩``. So a positive inner product
means training on j *lowered* the query loss: j **reinforced** the queried
behaviour. A negative one means j raised it: j **degraded** the behaviour.

Gradian's reported score is therefore

    score_j = + ⟨ g_q , P g_j ⟩      (positive = reinforced, negative = degraded)

and removing example j from a training set of n examples is predicted to
change the query loss by

    predicted_loss_delta_if_removed_j = score_j / n

(positive: removing a reinforcing example raises the query loss).

Note on DataInf's reference code: it reports ``IF = −⟨hvp, g_j⟩`` where a large
positive IF is *harmful*. Gradian's score is the negation of that quantity.
"""

from __future__ import annotations

import numpy as np

SIGN_CONVENTION = (
    "positive score = the example reinforced the queried behaviour; "
    "negative = it degraded it; predicted_loss_delta_if_removed = score / n"
)


def influence_from_inner_product(inner: np.ndarray) -> np.ndarray:
    """Map ⟨g_q, P g_j⟩ to Gradian's score. Identity by construction (see module docstring)."""
    return inner


def predicted_loss_delta_if_removed(score: np.ndarray, n: int) -> np.ndarray:
    """First-order change of the query loss if the example were removed: ``score / n``."""
    return np.asarray(score) / float(n)


def most_harmful_first(scores: np.ndarray) -> np.ndarray:
    """Indices ordering examples from most degrading (most negative) to most reinforcing."""
    return np.argsort(np.asarray(scores), kind="stable")
