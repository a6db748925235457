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


def _lacks(fresh, saved, seen: set[int] | None = None) -> bool:
    """Whether ``saved`` lacks an attribute that ``fresh`` has, or one of the marlkit objects it
    holds does (a class's default counts as had)."""
    seen = set() if seen is None else seen
    if id(fresh) in seen or not hasattr(fresh, "__dict__"):
        return False
    seen.add(id(fresh))
    for name, value in vars(fresh).items():
        if not hasattr(saved, name):
            return True
        kept = getattr(saved, name)
        if type(value).__module__.startswith("marlkit.") and type(kept) is type(value) and _lacks(value, kept, seen):
            return True
    return False


def _close(envs: list) -> None:
    for env in envs:
        try:
            env.close()
        except Exception:   # an env being thrown away, perhaps of other code: nothing to keep it for
            pass


# what unpickling an object of other code raises: its class or module gone, its state refused
_OTHER_CODE = (pickle.UnpicklingError, AttributeError, ImportError, TypeError, ValueError, EOFError)


def loads_states(envs: list, blobs: list[bytes]) -> tuple[list, bool]:
    """The envs ``dumps_state`` saved as ``blobs`` in place of ``envs``, which are closed, and True;
    or ``envs`` as they are and False where a blob was written by other code than today's: it no
    longer unpickles, or its objects lack attributes that a fresh env has (today's code would read an
    attribute the old object never had, mid-run; attributes set only once an env runs are not asked)."""
    loaded = []
    try:
        for blob in blobs:
            loaded.append(pickle.loads(blob))
    except _OTHER_CODE:
        _close(loaded)
        return envs, False
    if any(_lacks(fresh, saved) for saved, fresh in zip(loaded, envs)):
        _close(loaded)
        return envs, False
    for env in envs:
        env.close()
    return loaded, True
