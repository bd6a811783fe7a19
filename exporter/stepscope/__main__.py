"""``python -m stepscope`` is the ``stepscope`` command."""

import sys

from stepscope.app.cli import main

sys.exit(main())
