"""An env's state as bytes, for an exact resume, where the env declares that it round-trips."""
from __future__ import annotations

import io
import pickle

from gymnasium.utils import EzPickle


def _rebuild(cls, args: tuple, kwargs: dict, state: dict):
    obj = cls(*args, **kwargs)
    obj.__dict__.update(state)
    return obj


def _picklable(value) -> bool:
    try:
        _StatePickler(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    except Exception:
        return False
    return True


class _StatePickler(pickle.Pickler):
    """Pickles an env's state even when its class pickles only its constructor arguments
    (gymnasium's ``EzPickle``, used by PettingZoo envs): the object is rebuilt from those
    arguments and then given back every attribute that can be pickled, so a checkpointed env is
    the same env mid-episode. Attributes that cannot be pickled (a pygame surface) come from the
    fresh construction."""

    def reducer_override(self, obj):
        if isinstance(obj, EzPickle):
            state = {k: v for k, v in obj.__dict__.items() if not k.startswith("_ezpickle") and _picklable(v)}
            return _rebuild, (type(obj), obj._ezpickle_args, obj._ezpickle_kwargs, state)
        return NotImplemented


def dumps_state(obj) -> bytes | None:
    """Env state for an exact resume, or None when the env is not declared to round-trip
    (``exact_resume``: its state may live outside Python, in a C engine or a game process, and
    would come back desynchronised) or something in it cannot be pickled."""
    if not getattr(obj, "exact_resume", False):
        return None
    buffer = io.BytesIO()
    try:
        _StatePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    except Exception:
        return None
    return buffer.getvalue()


def loads_states(envs: list, blobs: list[bytes]) -> list:
    """The envs ``dumps_state`` saved as ``blobs``, in place of ``envs``, which are closed."""
    for env in envs:
        env.close()
    return [pickle.loads(blob) for blob in blobs]
