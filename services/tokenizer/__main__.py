import sys

from services.tokenizer.service import main

sys.exit(main())
