"""Policies by name: the one place that maps a configured name to a policy class."""

from __future__ import annotations

from typing import Any

from tenants.policies.base import Policy
from tenants.policies.book import BookPolicy
from tenants.policies.errors import UnknownPolicy
from tenants.policies.fcfs import FcfsPolicy
from tenants.policies.justitia import JustitiaPolicy
from tenants.policies.las import LasPolicy
from tenants.policies.sjf import SjfOraclePolicy
from tenants.policies.vtc import VtcPolicy

_POLICIES: dict[str, type[BookPolicy]] = {
    cls.name: cls for cls in (FcfsPolicy, VtcPolicy, JustitiaPolicy, SjfOraclePolicy, LasPolicy)
}
POLICY_NAMES: tuple[str, ...] = tuple(_POLICIES)


def make_policy(name: str, **kwargs: Any) -> Policy:
    """A new policy; `kwargs` go to its constructor (e.g. `pampered_jobs` for justitia)."""
    cls = _POLICIES.get(name)
    if cls is None:
        raise UnknownPolicy(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
    return cls(**kwargs)
