"""`python -m ztgi.bench`: the same as `ztgi bench`."""

import sys

from ztgi.bench.commands import main

sys.exit(main())
