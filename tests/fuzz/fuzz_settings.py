"""How much the fuzz tests try, and hypothesis's settings for them, shared by HTTP and ZMQ."""

from __future__ import annotations

import os

from hypothesis import HealthCheck

SCALE = int(os.environ.get("ZTGI_FUZZ_SCALE", "1"))  # more cases: ZTGI_FUZZ_SCALE=10
FUZZ = dict(deadline=None, database=None, derandomize=not os.environ.get("ZTGI_FUZZ_SEED_RANDOM"),
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                   HealthCheck.function_scoped_fixture])
