import sys

from .workflow import main

sys.exit(main())
