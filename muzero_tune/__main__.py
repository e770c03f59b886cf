"""``python -m muzero_tune``: the ``muzero-tune`` command line."""

import sys

from muzero_tune.cli import main

sys.exit(main())
