"""Where a loader's rank, world size, decode threads and token come from when the caller does
not say: the one place that decides it, for ``sluice.Loader`` and ``sluice.torch``.

Explicit arguments win; then ``torch.distributed`` when a process group is initialized (so
Lightning's default launcher and ``accelerate launch`` need no arguments); then ``RANK`` and
``WORLD_SIZE`` (torchrun); else rank 0 of 1. Decode threads in process default to this
machine's cores shared by the job's ranks on it (``LOCAL_WORLD_SIZE``). The token comes from
``token_file``, else ``$SLUICE_TOKEN``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional, Tuple


def distributed() -> Any:
    """``torch.distributed`` when torch is loaded and a process group is initialized, else
    ``None`` (torch is never imported here)."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not a number") from None


def rank_and_world(rank: Optional[int], world_size: Optional[int],
                   dist: Any = None) -> Tuple[int, int]:
    """This process's (rank, world size): explicit values, else ``dist``'s (a process
    group), else ``RANK``/``WORLD_SIZE``, else (0, 1)."""
    if dist is not None:
        return (dist.get_rank() if rank is None else rank,
                dist.get_world_size() if world_size is None else world_size)
    return (_env_int("RANK", 0) if rank is None else rank,
            _env_int("WORLD_SIZE", 1) if world_size is None else world_size)


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(local_ranks: Optional[int] = None) -> int:
    """Decode threads for one rank: this machine's cores divided by the ranks on it
    (``local_ranks``, else ``LOCAL_WORLD_SIZE``), at least one."""
    local = local_ranks if local_ranks else _env_int("LOCAL_WORLD_SIZE", 1)
    return max(1, cores() // max(1, local))


def env_token(token_file: Any) -> Optional[str]:
    """``$SLUICE_TOKEN`` when no ``token_file`` is given (the file is read, and an empty
    token refused, by the same code the daemons use)."""
    if token_file is not None:
        return None
    return os.environ.get("SLUICE_TOKEN")
