"""Policy errors, named for the state they report."""


class PolicyError(Exception):
    """Base class of fair-share policy errors."""


class UnknownPolicy(PolicyError, ValueError):
    """No policy has this name."""


class PolicyNotServable(PolicyError, ValueError):
    """A study-only policy was asked of a server (it needs what only a simulation knows)."""


class InvalidJob(PolicyError, ValueError):
    """A job the policy cannot order: bad numbers, unknown or cyclic parents, missing truth."""


class DuplicateJob(PolicyError, ValueError):
    """A job with this id is already active."""


class JobNotFound(PolicyError, KeyError):
    """No active job has this id."""


class InvalidCall(PolicyError, ValueError):
    """A ready call that does not fit its job (unknown node, other tenant, node already run)."""


class DuplicateCall(PolicyError, ValueError):
    """A call with this id is already ready or running."""


class CallNotFound(PolicyError, KeyError):
    """No ready or running call has this id."""


class CallNotReady(CallNotFound):
    """The call is not in the ready set (never added, already dispatched, or its job removed)."""


class CallNotRunning(CallNotFound):
    """The call is not running (not dispatched yet, already finished, or its job removed)."""


class InvalidProgress(PolicyError, ValueError):
    """A token count that goes backwards or is negative."""
