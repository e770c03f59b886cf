"""Videos of evaluation episodes: gymnasium's ``RecordVideo`` on ``render_mode="rgb_array"`` frames.

What this module owns
    :func:`check_video` (before any work: the env renders ``rgb_array`` frames and ``moviepy``, the
    ``video`` extra, imports; one line naming what is missing otherwise) and :class:`EpisodeRecorder`, a
    wrapper that records the episodes it is told to into a private folder and hands each finished video over
    as ``(file name, mp4 bytes)``, so the videos travel like any other result (from a Ray actor too) and
    are written where the run's outputs are.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from muzero_tune.envs.factory import EnvConfigError, MissingDependencyError

__all__ = ["EpisodeRecorder", "check_video"]

VIDEO_INSTALL = 'pip install -e ".[video]" (or: pip install moviepy)'


def check_video(make_rendering_env: Callable[[], gym.Env], env_id: str) -> None:
    """Raise when videos cannot be recorded: ``moviepy`` missing (:class:`MissingDependencyError`) or
    the env not rendering ``rgb_array`` frames (:class:`EnvConfigError` naming its render modes)."""
    try:
        import moviepy  # noqa: F401
    except ImportError as err:
        raise MissingDependencyError(
            f"eval video: recording needs moviepy, the video extra: {VIDEO_INSTALL}"
        ) from err
    try:
        env = make_rendering_env()
    except Exception as err:  # an env class that refuses the render_mode argument
        why = "its constructor takes no render_mode" if "render_mode" in str(err) else str(err)
        raise EnvConfigError(
            f"env.env_id: {env_id!r} cannot render rgb_array frames for a video ({why})"
        ) from None
    try:
        modes = env.metadata.get("render_modes", [])
        if env.render_mode != "rgb_array" or "rgb_array" not in modes:
            raise EnvConfigError(
                f"env.env_id: {env_id!r} cannot render rgb_array frames for a video (its render modes: "
                f"{list(modes) or 'none'})"
            )
    finally:
        env.close()


class EpisodeRecorder(gym.Wrapper):
    """Records the episodes started while :attr:`recording` is set (at most ``max_episodes`` per
    :meth:`start`), with gymnasium's ``RecordVideo``; :meth:`take` returns the finished ones."""

    def __init__(self, env: gym.Env, *, fps: int | None = None):
        self._root = tempfile.mkdtemp(prefix="muzero_tune_video_")
        self._folder = os.path.join(self._root, "episodes")  # RecordVideo creates it (no overwrite warning)
        self._left = self._count = 0
        self.prefix = "episode"
        inner = gym.wrappers.RecordVideo(
            env, video_folder=self._folder, episode_trigger=self._trigger, name_prefix="episode",
            disable_logger=True, fps=fps,
        )  # fmt: skip
        super().__init__(inner)

    def _trigger(self, episode_id: int) -> bool:
        if self._left <= 0:
            return False
        self._left -= 1
        self.env.name_prefix = f"{self.prefix}_{self._count}"
        self._count += 1
        return True

    def start(self, prefix: str, *, max_episodes: int) -> None:
        """Record the next ``max_episodes`` episodes, named ``<prefix>_<k>``."""
        self.prefix, self._left, self._count = prefix, int(max_episodes), 0

    def take(self) -> tuple[tuple[str, bytes], ...]:
        """The videos finished since the last call, as (file name, mp4 bytes); stops recording."""
        self._left = 0
        if getattr(self.env, "recording", False):
            self.env.stop_recording()
        out = []
        for path in sorted(glob.glob(os.path.join(self._folder, "*.mp4"))):
            with open(path, "rb") as f:
                out.append((os.path.basename(path).replace("-episode-", "_ep"), f.read()))
            os.remove(path)
        return tuple(out)

    def close(self) -> Any:
        try:
            return super().close()
        finally:
            shutil.rmtree(self._root, ignore_errors=True)
