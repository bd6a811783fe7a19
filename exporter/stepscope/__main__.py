"""``python -m stepscope`` is the ``stepscope`` command."""

import sys

from stepscope.cli import main

sys.exit(main())
