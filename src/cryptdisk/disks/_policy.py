"""Storage policies: named, ordered volumes of disks, as in ClickHouse.

A new file goes to the first volume (``volume_priority`` 1); within a volume
disks are used round robin, as ClickHouse's default ``round_robin`` load
balancing does. Moving parts between volumes by free space (ClickHouse's
``move_factor``) is not modelled.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import PolicyError
from ._base import Disk

__all__ = ["StoragePolicy", "Volume"]


@dataclass
class Volume:
    """An ordered set of disks that share the load of new files."""

    name: str
    disks: list[Disk]
    _counter: itertools.count[int] = field(default_factory=itertools.count, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if not self.disks:
            raise PolicyError(f"volume {self.name!r} has no disks")

    def next_disk(self) -> Disk:
        """The disk for the next new file (round robin)."""
        with self._lock:
            disk: Disk = self.disks[next(self._counter) % len(self.disks)]
        return disk


@dataclass
class StoragePolicy:
    """A named policy: volumes in priority order (the first receives new files)."""

    name: str
    volumes: Sequence[Volume]

    def __post_init__(self) -> None:
        if not self.volumes:
            raise PolicyError(f"storage policy {self.name!r} has no volumes")

    def choose_disk(self) -> Disk:
        """Where a new file goes: the first volume, its disks round robin."""
        return self.volumes[0].next_disk()

    def volume(self, name: str) -> Volume:
        for vol in self.volumes:
            if vol.name == name:
                return vol
        raise PolicyError(f"storage policy {self.name!r} has no volume {name!r} "
                          f"(volumes: {', '.join(v.name for v in self.volumes)})")

    @property
    def disks(self) -> list[Disk]:
        return [d for v in self.volumes for d in v.disks]
