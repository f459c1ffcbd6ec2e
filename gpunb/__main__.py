import sys

from gpunb.cli import main

sys.exit(main())
