"""``python -m generate``: see :mod:`generate.pipeline`."""

import sys

from generate.pipeline import main

sys.exit(main())
