"""UniZero on Atari with the segment pipeline, mirroring the spec's command line.

    python scripts/atari_unizero_segment_async_config.py --env ALE/Pong-v5 --seed 0                    # sync
    python scripts/atari_unizero_segment_async_config.py --env ALE/Pong-v5 --seed 0 --async-pipeline   # async
    python scripts/atari_unizero_segment_async_config.py --env ALE/Breakout-v5 --smoke  # a few minutes

Any ``ALE/<Game>-v5`` id works; settings come from the ``pong_unizero`` preset (a transformer world model
sized for a GPU learner) and can be changed with ``--set key=value``. ``--smoke`` runs the
``pong_unizero_smoke`` preset (a CPU-sized transformer, few simulations, a short run).
"""

from __future__ import annotations

import sys

from atari_entry import main

if __name__ == "__main__":
    sys.exit(main("unizero", None, __doc__))
