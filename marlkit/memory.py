"""Will a run fit in memory? The agents estimate what their rollout storage and update need from
the env's spec and their settings; the runner adds the groups up and refuses, in one line and
before any buffer is allocated, a run that cannot fit in the memory this machine has available."""
from __future__ import annotations

from dataclasses import dataclass

from marlkit.errors import ConfigError

GB = 2 ** 30


@dataclass
class MemoryEstimate:
    """Bytes one group's agent needs: ``rollout`` is held for the whole run, ``update`` on top of it
    while an update runs. ``shrink`` names the settings that make them smaller."""

    rollout: int = 0
    update: int = 0
    shrink: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return self.rollout + self.update


def available_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo (what can be allocated without swapping), or None where
    there is no such file."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_fits(estimates: dict[str, MemoryEstimate], available: int | None = None, headroom: float = 0.9) -> None:
    """Raise a ConfigError when the groups' estimates add up to more than ``headroom`` of the
    available memory; the message says where the memory goes and which settings shrink it."""
    available = available_bytes() if available is None else available
    if available is None:
        return
    need = sum(e.total for e in estimates.values())
    if need <= headroom * available:
        return
    parts = ", ".join(f"{g}: rollout {e.rollout / GB:.1f} GB + update {e.update / GB:.1f} GB"
                      for g, e in estimates.items())
    shrink = list(dict.fromkeys(k for e in estimates.values() for k in e.shrink))
    raise ConfigError(f"this run needs about {need / GB:.1f} GB ({parts}) but {available / GB:.1f} GB of memory is "
                      f"available; make it smaller with {', '.join(shrink)}")
