import sys

from services.worker.service import main

sys.exit(main())
