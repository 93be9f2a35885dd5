"""``python -m lakeckpt_tables.cli``: same as the ``lakeckpt`` command."""

import sys

from lakeckpt_tables.cli import main

sys.exit(main())
