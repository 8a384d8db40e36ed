"""`python -m benchmarks`: the same as `ztgi bench`."""

import sys

from ztgi.bench.bench import main

sys.exit(main())
