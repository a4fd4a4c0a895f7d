"""Engine errors, named for the state they report."""


class EngineError(Exception):
    """Base class of engine errors."""


class InvalidRequest(EngineError, ValueError):
    """A request the engine can never run (bad parameters, prompt longer than the context)."""


class DuplicateRequest(InvalidRequest):
    """A live request already has this id."""


class RequestNotFound(EngineError, KeyError):
    """No live request has this id."""


class EngineClosed(EngineError):
    """The engine has shut down and takes no more requests."""


class ModelNotFound(EngineError, FileNotFoundError):
    """The model name is neither the default nor a folder holding a checkpoint."""


class UnsupportedModel(EngineError, ValueError):
    """The checkpoint's architecture or settings are not ones the model runner implements."""
