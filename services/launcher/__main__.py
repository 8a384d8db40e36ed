import sys

from services.launcher.service import main

sys.exit(main())
