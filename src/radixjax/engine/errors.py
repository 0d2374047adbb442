"""The two ways a request fails: the engine refuses it, or the engine failed serving it."""


class RequestError(ValueError):
    """A request the engine cannot serve (empty prompt, longer than the context, ...)."""


class EngineError(RuntimeError):
    """The engine failed while serving this request (a step raised). The engine itself
    recovered (see Supervision.recover) unless `Engine.healthy` says otherwise."""
