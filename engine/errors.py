"""Errors the user can act on. Each message names the thing at fault and what to do about it."""

from __future__ import annotations


class EngineError(Exception):
    """Base class: the CLI prints these as one line and exits with status 2."""


class ModelFileError(EngineError):
    """A model file that cannot be used: not GGUF, truncated, missing a tensor, ..."""


class UnsupportedError(EngineError):
    """A valid request this engine or backend does not implement (architecture, quant type, op)."""


class ConfigError(EngineError):
    """A tuning config, experiment or CLI value that is not allowed; names the key and the
    allowed values."""


class BackendUnavailable(EngineError):
    """A backend whose library or device is not present on this machine."""


class KernelCompileError(EngineError):
    """A kernel variant that failed to compile (the compiler's log is in the message)."""


class ReferenceDriftError(EngineError):
    """This device's reference path disagrees with the NumPy backend (the drift sentinel): a
    worker on it cannot vouch for any candidate, so it refuses to tune."""
