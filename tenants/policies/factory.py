"""Policies by name: the one place that maps a configured name to a policy class.

Every policy is available to the scheduling study (`make_policy`); a server takes only those
that need nothing it does not have (`SERVING_POLICY_NAMES`, `make_serving_policy`).
`sjf-oracle` orders by the true output lengths, which exist only in a simulation: it is the
study's yardstick of how fast an order could be.
"""

from __future__ import annotations

from typing import Any

from tenants.policies.base import Policy
from tenants.policies.bookkeeping import BookPolicy
from tenants.policies.errors import PolicyNotServable, UnknownPolicy
from tenants.policies.fcfs import FcfsPolicy
from tenants.policies.justitia import JustitiaPolicy
from tenants.policies.las import LasPolicy
from tenants.policies.sjf import SjfOraclePolicy
from tenants.policies.vtc import VtcPolicy

_POLICIES: dict[str, type[BookPolicy]] = {
    cls.name: cls for cls in (FcfsPolicy, VtcPolicy, JustitiaPolicy, SjfOraclePolicy, LasPolicy)
}
POLICY_NAMES: tuple[str, ...] = tuple(_POLICIES)
# policy -> why a server cannot run it
_STUDY_ONLY = {
    SjfOraclePolicy.name: "it orders calls by their true output lengths, which a server never "
    "knows (it is the scheduling study's yardstick, `fairgate bench sched`)",
}
SERVING_POLICY_NAMES: tuple[str, ...] = tuple(n for n in POLICY_NAMES if n not in _STUDY_ONLY)


def make_policy(name: str, **kwargs: Any) -> Policy:
    """A new policy; `kwargs` go to its constructor (e.g. `pampered_jobs` for justitia)."""
    cls = _POLICIES.get(name)
    if cls is None:
        raise UnknownPolicy(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
    return cls(**kwargs)


def check_servable(name: str) -> None:
    """`UnknownPolicy` or `PolicyNotServable` unless a server can run the policy `name`."""
    if name in _STUDY_ONLY:
        raise PolicyNotServable(
            f"policy {name!r} cannot serve: {_STUDY_ONLY[name]}; serve one of "
            f"{', '.join(SERVING_POLICY_NAMES)}"
        )
    if name not in _POLICIES:
        raise UnknownPolicy(
            f"unknown policy {name!r}; serve one of {', '.join(SERVING_POLICY_NAMES)}"
        )


def make_serving_policy(name: str, **kwargs: Any) -> Policy:
    """`make_policy` for a server: refuses the study-only policies (`check_servable`)."""
    check_servable(name)
    return make_policy(name, **kwargs)
