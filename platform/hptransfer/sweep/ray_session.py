"""Start (or join) Ray with explicit resources; shut down only what we started."""

from __future__ import annotations

import contextlib
import os

from hptransfer.spec import RaySpec


@contextlib.contextmanager
def ray_session(cfg: RaySpec, address: str | None = None):
    import ray

    from hptransfer.env import configure

    configure()
    if ray.is_initialized():
        yield
        return
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        # Explicit sizes: Ray's defaults take 30% of RAM for the object store and every core.
        # address="local": always a fresh embedded cluster, never a stray `ray start` one.
        ray.init(
            address="local",
            num_cpus=cfg.num_cpus or os.cpu_count(),
            include_dashboard=False,
            object_store_memory=cfg.object_store_mb * 1024 * 1024,
            log_to_driver=True,
            configure_logging=True,
            logging_level="WARNING",
        )
    try:
        yield
    finally:
        ray.shutdown()
