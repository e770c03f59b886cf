"""MuZero on Atari with the segment pipeline, mirroring the spec's command line.

    python scripts/atari_muzero_segment_async_config.py --env ALE/Pong-v5 --seed 0                    # sync
    python scripts/atari_muzero_segment_async_config.py --env ALE/Pong-v5 --seed 0 --async-pipeline   # async
    python scripts/atari_muzero_segment_async_config.py --env ALE/Breakout-v5 --smoke  # 1-2 min

Any ``ALE/<Game>-v5`` id works; settings come from the ``pong_muzero`` preset (the reference system's Atari
settings) and can be changed with ``--set key=value``. ``--smoke`` runs the ``pong_muzero_smoke`` preset
(fewer simulations, a small network and batch, a short run), the whole pipeline in a minute or two on a CPU.
"""

from __future__ import annotations

import sys

from atari_entry import main

if __name__ == "__main__":
    sys.exit(main("muzero", None, __doc__))
