"""`python -m benchmarks`: the same as `ztgi bench`."""

import sys

from benchmarks.bench import main

sys.exit(main())
