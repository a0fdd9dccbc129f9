"""``python -m kale_dagster.cli``: the same as the ``kale`` command."""

import sys

from kale_dagster.cli import main

sys.exit(main())
