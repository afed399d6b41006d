"""`python -m lingcode`: the same as the `lingcode` console script."""

import sys

from lingcode.cli import main

sys.exit(main())
